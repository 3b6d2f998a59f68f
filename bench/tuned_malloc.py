"""glibc gives PyTorch's large buffers back to the kernel after every step
unless its mmap threshold is raised, and page faults are dear in this sandbox
(a CNN ran ~3x slower): a fair PyTorch baseline runs with MALLOC_MMAP_THRESHOLD_
and MALLOC_TRIM_THRESHOLD_ raised. The shell scripts set them (TUNED_MALLOC_ENV);
a script started without them runs itself again with them (same pid)."""
import os
import sys

TUNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "1000000000", "MALLOC_TRIM_THRESHOLD_": "1000000000"}


def rerun_with_tuned_malloc():
    """Call first, before torch is imported: returns only with both set."""
    if any(k not in os.environ for k in TUNED_MALLOC):
        os.environ.update({k: v for k, v in TUNED_MALLOC.items() if k not in os.environ})
        os.execv(sys.executable, [sys.executable] + sys.argv)
