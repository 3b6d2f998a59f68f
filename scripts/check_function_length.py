#!/usr/bin/env python3
"""No library function over LIMIT lines (default 60).

  scripts/check_function_length.py [ROOT] [LIMIT]     (ROOT: default the repository)

Scans the .cpp and .hpp files of the library (tensor/ kernels/ model/ data/ net/
train/ actors/ include/) and prints, for every function longer than LIMIT lines,
  FILE:LINE: function NAME is N lines (limit LIMIT)
then exits 1; exits 0 when there is none.

The rule. A function is every body in braces that follows a parameter list:
free functions, member functions defined in or out of their class, constructors
and destructors, operators, and a lambda assigned at namespace or class scope
(named by its variable). Its length is counted from the line where its
declaration starts (the first line of the declaration, its template<...> and
attributes included, comments before it not) to the line of its closing brace,
both inclusive: a function written on lines 10 to 70 is 61 lines. Blank lines
and comments inside it count. Lambdas, local classes and blocks inside a function
are part of that function. Namespaces, classes, structs, unions, enums,
extern "C" blocks and brace initializers are not functions; the functions
inside classes and namespaces are counted one by one.

How. Comments, string and character literals (raw strings R"d(...)d" included)
and preprocessor lines (with their continuations) are blanked first, keeping
every newline; then the braces are matched. At namespace or class scope the text
since the previous ';', '{' or '}' (an access specifier removed) is the head of
a '{': it opens a function when it holds a parameter list followed only by
qualifiers (const, noexcept(...), override, -> type, requires ..., ...) or by a
constructor's initializer list. Heuristics, checked by hand on this code base.
"""
import os
import re
import sys

FOLDERS = ["tensor", "kernels", "model", "data", "net", "train", "actors", "include"]
EXTENSIONS = (".cpp", ".hpp")
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def blank(text):
    """The text with comments, literals and preprocessor lines replaced by spaces (newlines kept)."""
    out = list(text)
    n = len(text)
    i = 0
    line_start = True  # only whitespace since the last newline

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if c == "\n":
            line_start = True
            i += 1
            continue
        if c in " \t\r\f\v":
            i += 1
            continue
        if line_start and c == "#":  # a preprocessor line, continuations and comments included
            j = i
            while j < n and text[j] != "\n":
                if text.startswith("/*", j):
                    end = text.find("*/", j + 2)
                    j = n if end < 0 else end + 2
                    continue
                if text[j] == "\\" and j + 1 < n and text[j + 1] == "\n":
                    j += 2
                    continue
                j += 1
            wipe(i, j)
            i = j
            continue
        line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            wipe(i, j)
            i = j
            continue
        if c == '"':
            raw = re.search(r"(?:u8|u|U|L)?R$", text[max(0, i - 3):i])
            if raw and not (i - len(raw.group(0)) > 0 and
                            (text[i - len(raw.group(0)) - 1].isalnum() or text[i - len(raw.group(0)) - 1] == "_")):
                open_paren = text.find("(", i)
                delim = text[i + 1:open_paren]
                end = text.find(")" + delim + '"', open_paren)
                j = n if end < 0 else end + len(delim) + 2
                wipe(i + 1, j - 1)
                i = j
                continue
            j = i + 1
            while j < n and text[j] != '"' and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            wipe(i + 1, j)
            i = j + 1
            continue
        if c == "'":
            # A digit separator (1'000'000) when the token it is in starts with a digit.
            k = i
            while k > 0 and (text[k - 1].isalnum() or text[k - 1] in "_.'"):
                k -= 1
            if k < i and text[k].isdigit():
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != "'" and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            wipe(i + 1, j)
            i = j + 1
            continue
        i += 1
    return "".join(out)


# What may follow a parameter list before the body: cv and ref qualifiers, noexcept (its argument
# emptied by collapse_parens), override, final, mutable (lambdas), a trailing return type, a requires clause.
QUALIFIERS = re.compile(
    r"^(?:\s*(?:(?:const|volatile|noexcept|override|final|mutable|constexpr|try)\b|&&|&|\(\)))*"
    r"\s*(?:->.*|requires\b.*)?$", re.S)
ACCESS = re.compile(r"^\s*(?:(?:public|private|protected)\s*:(?!:)\s*)+")
# A constructor's parameter list followed by its initializer list: what follows the group, then the head.
CTOR = re.compile(r"^\s*(?:noexcept\b\s*(?:\(\))?\s*)?:(?!:)")
INITIALIZER_LIST = re.compile(r"\)\s*(?:noexcept\b\s*(?:\(\))?\s*)?:(?!:)")


def top_level_groups(head):
    """The (start, end) of head's top-level parenthesized groups; None when parentheses do not balance."""
    groups, depth, start = [], 0, 0
    for k, c in enumerate(head):
        if c == "(":
            if depth == 0:
                start = k
            depth += 1
        elif c == ")":
            depth -= 1
            if depth < 0:
                return None
            if depth == 0:
                groups.append((start, k + 1))
    return groups if depth == 0 else None


def collapse_parens(s):
    """s with every parenthesized group emptied: 'noexcept(a(b))' -> 'noexcept()'."""
    out, depth = [], 0
    for c in s:
        if c == "(":
            if depth == 0:
                out.append("(")
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                out.append(")")
        elif depth == 0:
            out.append(c)
    return "".join(out)


def function_name(head, params_start):
    """The name before the parameter list at params_start, or None when it is not a function's."""
    before = head[:params_start].rstrip()
    m = re.search(r"(operator\s*(?:\(\s*\)|\[\s*\]|[^\sA-Za-z0-9_(]+|\s[A-Za-z_][\w:<>\s*&]*?))\s*$", before)
    if m:
        name_end = m.start()
        owner = re.search(r"((?:[A-Za-z_]\w*(?:<[^<>;{}]*>)?\s*::\s*)*)$", before[:name_end])
        return (owner.group(1) + m.group(1)).replace(" ", "")
    if before.endswith("]"):  # a lambda: named by the variable it initializes
        m = re.search(r"([A-Za-z_]\w*)\s*(?:=|\{)\s*\[[^\]]*\]$", before)
        return m.group(1) if m else None
    m = re.search(r"((?:[A-Za-z_]\w*(?:<[^<>;{}]*>)?\s*::\s*)*~?\s*[A-Za-z_]\w*)$", before)
    if not m:
        return None
    name = re.sub(r"\s+", "", m.group(1))
    last = name.split("::")[-1].lstrip("~")
    if last in ("if", "for", "while", "switch", "catch", "return", "sizeof", "decltype", "alignas",
                "static_assert", "noexcept"):
        return None
    return name


def classify(head):
    """('function', name) | ('scope', None) | ('other', None) for the head of a '{'."""
    h = ACCESS.sub("", head)
    groups = top_level_groups(h) or []
    for start, end in groups:  # a constructor: the first group followed by ':'
        if CTOR.match(collapse_parens(h[end:])):
            name = function_name(h, start)
            if name:
                return ("function", name)
    for start, end in reversed(groups):  # any other function: a group followed by qualifiers only
        if not QUALIFIERS.match(collapse_parens(h[end:])):
            break
        name = function_name(h, start)  # None for noexcept(...), decltype(...) and the like
        if name:
            return ("function", name)
    bare_lambda = re.search(r"([A-Za-z_]\w*)\s*=\s*\[[^\]]*\]\s*(?:mutable\b\s*)?$", h)  # '= [] {' has no ()
    if bare_lambda:
        return ("function", bare_lambda.group(1))
    words = set(IDENT.findall(collapse_parens(h)))
    if "namespace" in words or "extern" in words:
        return ("scope", None)
    if "enum" in words or re.search(r"=\s*$", h):
        return ("other", None)
    if words & {"class", "struct", "union"}:
        return ("scope", None)
    return ("other", None)  # a brace initializer: 'std::vector<int> v{1, 2};'


def class_name(head):
    """'name::' for the head of a class, struct or union; '' for a namespace's."""
    h = re.split(r"(?<!:):(?!:)", collapse_parens(ACCESS.sub("", head)))[0]
    names = re.findall(r"\b(?:class|struct|union)\s+(?:alignas\s*\(\)\s*)?([A-Za-z_][\w:]*(?:<[^{};]*>)?)", h)
    return names[-1].replace(" ", "") + "::" if names and "namespace" not in IDENT.findall(h) else ""


def skip_initializer_list(code, k):
    """The index of the body's '{' of a constructor whose head ends at k inside its initializer list:
    the first '{' after a ')' or a '}' (a member's '{' follows its name)."""
    last = "_"  # the last character before k that is not a space: the end of a member's name
    while k < len(code):
        c = code[k]
        if c == "{" and last in ")}":
            return k
        if c in "({":
            k = matching(code, k)
            c = code[k]
        if not c.isspace():
            last = c
        k += 1
    raise Unbalanced(k)


class Unbalanced(Exception):
    """Brackets that do not match (an #if whose branches open braces, say): the file cannot be checked."""


def matching(code, k):
    """The index of the bracket closing the one at k."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    opener, closer = code[k], pairs[code[k]]
    depth = 0
    for j in range(k, len(code)):
        if code[j] == opener:
            depth += 1
        elif code[j] == closer:
            depth -= 1
            if depth == 0:
                return j
    raise Unbalanced(k)


def functions(code):
    """(name, first line, last line) of every function in the blanked code."""
    found = []
    line_of = []
    line = 1
    for c in code:
        line_of.append(line)
        if c == "\n":
            line += 1
    line_of.append(line)

    def scan(start, end, owner):  # a namespace or class body, code[start:end]; owner: 'class_name::' or ''
        head_start = start
        k = start
        while k < end:
            c = code[k]
            if c in ";}":
                head_start = k + 1
            elif c == "(":  # parentheses may hold braces (lambdas in default arguments)
                k = matching(code, k)
            elif c == "{":
                head = code[head_start:k]
                kind, name = classify(head)
                body = k
                if kind == "function" and INITIALIZER_LIST.search(collapse_parens(head)) and \
                        not head.rstrip().endswith(")"):
                    body = skip_initializer_list(code, k)  # k opens a member's brace initializer: 'a_{x}'

                close = matching(code, body)
                if kind == "function":
                    declaration = ACCESS.sub("", head)  # starts after 'public:' and the like
                    first = head_start + len(head) - len(declaration.lstrip())
                    found.append((owner + name, line_of[first], line_of[close]))
                elif kind == "scope":
                    scan(k + 1, close, owner + class_name(head))
                k = close
                head_start = k + 1
            k += 1

    scan(0, len(code), "")
    return found


def library_files(root):
    for folder in FOLDERS:
        for directory, _, names in os.walk(os.path.join(root, folder)):
            for name in sorted(names):
                if name.endswith(EXTENSIONS):
                    yield os.path.join(directory, name)


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    limit = int(argv[2]) if len(argv) > 2 else 60
    long_ones = unchecked = checked = 0
    for path in sorted(library_files(root)):
        with open(path, encoding="utf-8", errors="replace") as f:
            code = blank(f.read())
        rel = os.path.relpath(path, root)
        try:
            found = functions(code)
        except Unbalanced as e:
            line = code.count("\n", 0, e.args[0]) + 1
            print(f"{rel}:{line}: this bracket is never closed (an #if's branches?): the file cannot be checked")
            unchecked += 1
            continue
        for name, first, last in found:
            checked += 1
            length = last - first + 1
            if length > limit:
                print(f"{rel}:{first}: function {name} is {length} lines (limit {limit})")
                long_ones += 1
    if long_ones or unchecked:
        print(f"function length: {long_ones} function(s) over {limit} lines"
              + (f", {unchecked} file(s) that cannot be checked" if unchecked else ""))
        return 1
    print(f"function length: all {checked} library functions are at most {limit} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
