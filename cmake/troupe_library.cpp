// libtroupe is the layers' static libraries linked whole (CMakeLists.txt);
// this file only gives the shared library a source of its own.
