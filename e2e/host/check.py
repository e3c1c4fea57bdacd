"""Static guard for host prerequisites: which host tools do our scripts call, and is each one installed first?

Role: keeps the README's promise that its two commands set up a fresh machine. ``e2e/host/packages.txt`` lists
every Debian package the project installs and the tools it provides; ``e2e/host/install.sh`` installs them.
This module reads every shell script in the repository (and the Makefile's recipes), finds each command they
run, and reports two kinds of problem:

- ``unlisted``: a command that is neither in the manifest, nor on a fresh machine of the project's kind
  (``BASELINE``), nor built by the repo (``e2e/build/build.sh``), nor a function or script of ours;
- ``order``: a manifest tool used before the install step ran in that script. A use inside a shell function
  counts where the function is called (functions of sourced libraries included); a library's top-level use
  counts at its ``source`` line; a Makefile target counts as installed when it depends on ``host-deps``.

Neighbours: tests/test_host_deps.py runs it (unit tier); ``python3 e2e/host/check.py`` prints the findings.
The shell reader is deliberately small: quotes, ``$(...)``, backticks, here-docs (their ``$(...)`` only),
``case`` patterns, functions and line continuations, which is what our scripts use. Words that start with a
variable (``"$KF_BIN/kubelet"``) are binaries of ours, never host tools.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
MANIFEST = REPO / "e2e" / "host" / "packages.txt"
INSTALLER = "e2e/host/install.sh"

# Present on a fresh machine of the project's kind (Debian bookworm with the kind's toolchains), checked with
# `command -v` on one before anything was installed: coreutils, util-linux, procps, findutils, grep, sed, mawk,
# tar, gzip, iproute2's `bridge`, curl, git, jq, lsof, psmisc, libc-bin, and the toolchains the README requires.
BASELINE = frozenset("""
    [ awk base64 basename bash cat chmod chown cmp comm cp cut date dd df diff dirname du echo env expr false
    file find findmnt flock free fuser getent git grep groupadd gzip head hostname id install jq kill ldconfig ldd
    ln logger ls lsof md5sum mkdir mktemp mknod mount mountpoint mv nice nohup nproc nsenter od paste pgrep pidof
    pkill printf ps pwd python3 python3.11 readlink realpath rm rmdir sed seq setsid sh sha256sum sleep sort split
    stat sync sysctl tail tar tee test timeout touch tr true truncate umount uname uniq unshare useradd wc xargs
    yes zcat curl wget go make apt-get dpkg dpkg-query sha1sum chroot
""".split())

# Bash builtins and keywords (never host tools).
BUILTINS = frozenset("""
    . : [[ ]] alias bg bind break builtin caller case cd command compgen complete continue declare dirs disown do
    done echo elif else enable esac eval exec exit export fc fg fi for function getopts hash help history if in
    jobs let local logout mapfile popd printf pushd read readarray readonly return select set shift shopt source
    suspend then time trap type typeset ulimit umask unalias unset until wait while { } ! test true false
""".split())

# Wrappers whose next word is itself a command.
WRAPPERS = frozenset({"exec", "nohup", "setsid", "timeout", "nice", "env", "xargs", "sudo", "command", "builtin"})


@dataclasses.dataclass(frozen=True)
class Use:
    """One command word at one line of one file."""

    word: str
    line: int


@dataclasses.dataclass
class Script:
    path: str
    top: list[Use]                      # commands outside functions, in order
    functions: dict[str, list[Use]]     # name -> commands in its body
    sources: list[Use]                  # `source FILE` / `. FILE` (word = the resolved repo path or "")


def load_manifest(path: pathlib.Path | None = None) -> dict[str, str]:
    """tool -> Debian package, from packages.txt."""
    tools: dict[str, str] = {}
    for raw in (path or MANIFEST).read_text().splitlines():
        line = raw.split("#", 1)[0].split()
        for tool in line[1:]:
            tools[tool] = line[0]
    return tools


# --- a small shell reader -------------------------------------------------------------------------------

_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
_FUNC = re.compile(r"^\s*(?:function\s+)?([A-Za-z_][A-Za-z0-9_:-]*)\s*\(\)\s*\{?")
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) with continuations joined and here-doc bodies reduced to their $(...) parts."""
    out: list[tuple[int, str]] = []
    lines = text.splitlines()
    i, pending, start = 0, "", 0
    while i < len(lines):
        line = lines[i]
        if not pending:
            start = i + 1
        if line.rstrip().endswith("\\") and not line.lstrip().startswith("#"):
            pending += line.rstrip()[:-1] + " "
            i += 1
            continue
        if _open_quote(pending + line) and i + 1 < len(lines):
            pending += line + " "
            i += 1
            continue
        full = pending + line
        pending = ""
        out.append((start, full))
        i += 1
        for m in _HEREDOC.finditer(_strip_comment(full)):
            quoted, delim = m.group(1), m.group(2)
            while i < len(lines) and lines[i].strip() != delim:
                if not quoted:
                    out.extend((i + 1, sub) for sub in _substitutions(lines[i]))
                i += 1
            i += 1
    return out


def _open_quote(text: str) -> bool:
    """Whether a quote opened in ``text`` (outside comments) is still open at its end."""
    quote, prev = "", " "
    for ch in text:
        if quote:
            if ch == quote and (quote == "'" or prev != "\\"):
                quote = ""
        elif ch in "'\"" and prev != "\\":
            quote = ch
        elif ch == "#" and prev in " \t;|&(":
            return False
        prev = ch
    return bool(quote)


def _substitutions(text: str) -> list[str]:
    """The bodies of $(...) in a here-doc line (nesting respected)."""
    found, i = [], 0
    while (j := text.find("$(", i)) >= 0:
        if text.startswith("$((", j):
            i = j + 3
            continue
        depth, k = 1, j + 2
        while k < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[k], 0)
            k += 1
        found.append(text[j + 2:k - 1])
        i = k
    return found


def _strip_comment(line: str) -> str:
    """The line without a trailing comment (a # at a word start, outside quotes)."""
    quote, prev = "", " "
    for k, ch in enumerate(line):
        if quote:
            if ch == quote and (quote == "'" or prev != "\\"):
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and prev in " \t;|&(":
            return line[:k]
        prev = ch
    return line


class _Lexer:
    """Splits logical lines into simple commands. Keeps the one piece of state that spans lines: whether the
    next words are a ``case`` pattern (after ``case X in`` and after each ``;;``)."""

    def __init__(self) -> None:
        self.pattern = False
        self.test = False

    def split(self, line: str) -> list[list[str]]:
        """Simple commands of one logical line: lists of words, command substitutions split out recursively."""
        commands: list[list[str]] = []
        words: list[str] = []
        word = ""
        quote = ""
        redirect = False  # the next word is a redirection target, not an argument
        i, n = 0, len(line)

        def end_word() -> None:
            nonlocal word, redirect
            if word == "esac" and not words:
                self.pattern = False
                word = ""
                return
            if word == "[[" and not words:
                self.test = True
            elif word == "]]":
                self.test = False
            if word:
                if not redirect:
                    words.append(word)
                if len(words) == 3 and words[0] == "case" and words[2] == "in":
                    self.pattern, words[:] = True, []
                redirect = False
                word = ""

        def end_command() -> None:
            nonlocal words
            end_word()
            if words:
                if words[0] == "case" and words[-1] == "in":
                    self.pattern = True
                else:
                    commands.append(words)
            words = []

        def matching(k: int, open_: str, close: str) -> int:
            depth, q = 1, ""
            while k < n and depth:
                c = line[k]
                if q:
                    q = "" if c == q else q
                elif c in "'\"" and open_ != "{":
                    q = c
                else:
                    depth += (c == open_) - (c == close)
                k += 1
            return k

        while i < n:
            ch = line[i]
            if quote == "'":
                quote = "" if ch == "'" else quote
                word += ch
                i += 1
                continue
            if ch == "\\" and i + 1 < n:
                word += line[i:i + 2]
                i += 2
                continue
            if line.startswith("$((", i):  # arithmetic expansion: no commands inside
                k = matching(i + 2, "(", ")")
                word += "$A"
                i = k
                continue
            if line.startswith("((", i) and not word:  # arithmetic command, e.g. for (( ...; ...; ... ))
                k = line.find("))", i)
                i = n if k < 0 else k + 2
                continue
            if line.startswith("${", i):
                k = matching(i + 2, "{", "}")
                word += "$V"
                i = k
                continue
            if line.startswith("$(", i) or ch == "`":
                if ch == "`":
                    k = line.find("`", i + 1)
                    k = n if k < 0 else k
                    inner, after = line[i + 1:k], k + 1
                else:
                    k = matching(i + 2, "(", ")")
                    inner, after = line[i + 2:k - 1], k
                saved, self.pattern = self.pattern, False
                commands.extend(self.split(inner))
                self.pattern = saved
                word += "$_"
                i = after
                continue
            if quote == '"':
                quote = "" if ch == '"' else quote
                word += ch
                i += 1
                continue
            if ch in "'\"":
                quote = ch
                word += ch
                i += 1
                continue
            if ch == "#" and not word:
                break
            if self.pattern and ch in "|(":
                word += ch
                i += 1
                continue
            if self.pattern and ch == ")":
                word, words, self.pattern = "", [], False  # the pattern of a case branch
                i += 1
                continue
            if ch in " \t":
                end_word()
            elif ch == ";" and line.startswith(";;", i):
                end_command()
                self.pattern = True
                i += 2
                continue
            elif ch == "(" and word.endswith("="):  # arr=( ... ): words, no commands
                k = matching(i + 1, "(", ")")
                word += "(...)"
                i = k
                continue
            elif self.test and ch in "|&()":
                word += ch  # inside [[ ... ]]: && || ( ) are part of the test
            elif ch == "{" and i + 1 < n and line[i + 1] not in " \t":
                word += ch  # {} of find -exec, or a brace expansion: not a group
            elif ch in ";|&(){}" and not (ch in "{}" and word):
                if ch == "&" and (word.endswith(">") or line.startswith("&>", i)):
                    word += ch
                else:
                    end_command()
            elif ch in "<>":
                if word.isdigit() or word == "&":
                    word = ""  # a file descriptor number, or &> (both streams)
                end_word()
                k = i
                while k < n and line[k] in "<>&0123456789-":
                    k += 1
                if k < n and line[k] == "(":  # process substitution <( ... ) or >( ... )
                    end = matching(k + 1, "(", ")")
                    commands.extend(self.split(line[k + 1:end - 1]))
                    i = end
                    continue
                # >&2, 2>&1, >&- duplicate or close a descriptor: no target word follows
                redirect = not re.fullmatch(r"[<>]+&[0-9-]*", line[i:k])
                i = k
                continue
            else:
                word += ch
            i += 1
        end_command()
        return commands


def _split_commands(line: str) -> list[list[str]]:
    return _Lexer().split(line)


def _command_word(words: list[str]) -> str | None:
    """The word that names the command (after assignments, keywords and wrappers), or None."""
    k = 0
    while k < len(words):
        w = words[k]
        if _ASSIGN.match(w):
            k += 1
            continue
        if w in {"then", "do", "else", "elif", "if", "while", "until", "!", "time", "{", "}"}:
            k += 1
            continue
        if w in {"for", "case", "select", "in", "done", "fi", "esac", ";;", "function", "[["}:
            return None
        if w in WRAPPERS:
            k += 1
            if w == "command" and k < len(words) and words[k] in {"-v", "-V"}:
                k += 1  # `command -v X` probes X: still a use of X
            while k < len(words) and words[k].startswith("-"):
                k += 1 + (words[k] in {"-n", "-s", "-k", "-u", "-I", "-d"})
            if w == "timeout":
                k += 1  # its duration
            if w == "env":
                while k < len(words) and _ASSIGN.match(words[k]):
                    k += 1
            continue
        return w.strip("\"'")
    return None


def parse(path: pathlib.Path, text: str | None = None) -> Script:
    """Read one shell script into its top-level commands, function bodies and sourced files."""
    text = path.read_text() if text is None else text
    script = Script(path=str(path), top=[], functions={}, sources=[])
    current: str | None = None
    depth = 0
    lexer = _Lexer()
    for lineno, raw in _logical_lines(text):
        line = _strip_comment(raw)
        m = _FUNC.match(line)
        if m and current is None:
            current = m.group(1)
            script.functions[current] = []
            depth = 0
            line = line[m.end():] if line[m.end() - 1] == "{" else line[m.end():]
            depth = 1 if "{" in raw[:m.end()] else 0
        for words in lexer.split(line):
            head = words[0].strip("\"'") if words else ""
            if head in {"source", "."} and len(words) > 1:
                script.sources.append(Use(_resolve(words[1], path) or "", lineno))
                continue
            cmd = _command_word(words)
            if cmd:
                (script.functions[current] if current else script.top).append(Use(cmd, lineno))
        if current is not None:
            depth += _brace_delta(line)
            if depth <= 0 and ("}" in line):
                current = None
    return script


def _external(path: pathlib.Path) -> set[str]:
    """Tools a script declares it expects from the user's machine (`# host-deps: external TOOL ...`): only for
    scripts that are no part of the README's commands (e.g. the kind path for machines with Docker)."""
    found: set[str] = set()
    for m in re.finditer(r"^# host-deps: external ([^:\n]+)", path.read_text(), re.M):
        found.update(m.group(1).split())
    return found


def _brace_delta(line: str) -> int:
    words = re.findall(r"(?<![\w$\"'])[{}](?![\w\"'])", re.sub(r"'[^']*'|\"[^\"]*\"|\$\{[^}]*\}", "", line))
    return words.count("{") - words.count("}")


def _resolve(word: str, origin: pathlib.Path) -> str | None:
    """The repo path a `source` or call word names, when its literal tail identifies one script."""
    tail = word.strip("\"'")
    tail = tail.rsplit("}", 1)[-1] if "}" in tail else tail
    tail = tail.rsplit(")", 1)[-1] if ")" in tail else tail
    tail = re.sub(r"^.*\$[A-Za-z_][A-Za-z0-9_]*", "", tail).lstrip("/")
    if not tail.endswith(".sh"):
        return None
    base = origin.resolve().parent
    for cand in (base / tail, REPO / tail):
        if cand.is_file():
            return str(cand.relative_to(REPO))
    hits = [p for p in _shell_files() if p.endswith("/" + tail) or p == tail]
    return hits[0] if len(hits) == 1 else None


def _shell_files() -> list[str]:
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, text=True, check=True).stdout.split()
    files = []
    for f in out:
        p = REPO / f
        if not p.is_file():
            continue
        if f.endswith(".sh") or f == ".ci/run" or (not p.suffix and p.read_bytes()[:20].startswith(b"#!/usr/bin/env bash")):
            files.append(f)
    return sorted(files)


# --- the checks -----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Finding:
    kind: str       # "unlisted" | "order" | "target"
    file: str
    line: int
    word: str

    def __str__(self) -> str:
        if self.kind == "unlisted":
            return (f"{self.file}:{self.line}: `{self.word}` is a host tool that e2e/host/packages.txt does not list "
                    "(add its Debian package there) and a fresh machine lacks")
        if self.kind == "target":
            return (f"Makefile: target `{self.word}` reaches host tools but does not depend on `host-deps` (the "
                    "install step), so on a fresh machine they are used before they are installed")
        return (f"{self.file}:{self.line}: `{self.word}` (from e2e/host/packages.txt) is used before the install "
                f"step ({INSTALLER}) has run in this script")


def _is_installer(word: str) -> bool:
    return word.strip("\"'").endswith("host/install.sh") or word in {"host-deps"}


def _is_ours(word: str, functions: set[str], built: set[str]) -> bool:
    w = word.strip("\"'")
    return (w in functions or w in built or w in BUILTINS or w.startswith(("$", "./", "../", "~"))
            or w.endswith((".sh", ".py")) or "/" in w and not w.startswith("/") or "$_" in w or "=" in w)


def _flatten(uses: list[Use], functions: dict[str, list[Use]], seen: frozenset[str] = frozenset()) -> list[Use]:
    """Uses with function calls expanded: a tool used inside a function counts at the call's line."""
    out: list[Use] = []
    for u in uses:
        if u.word in functions and u.word not in seen:
            out.extend(Use(inner.word, u.line) for inner in _flatten(functions[u.word], functions, seen | {u.word}))
        out.append(u)
    return out


def check_script(rel: str, manifest: dict[str, str], built: set[str],
                 cache: dict[str, Script] | None = None) -> list[Finding]:
    """Findings of one script (its sourced libraries' functions and top-level code included)."""
    cache = {} if cache is None else cache
    path = REPO / rel
    script = cache.setdefault(rel, parse(path))
    functions: dict[str, list[Use]] = {}
    top: list[Use] = []
    for src in script.sources:
        lib = cache.setdefault(src.word, parse(REPO / src.word)) if src.word else None
        if lib:
            functions.update(lib.functions)
            top.extend(Use(u.word, src.line) for u in lib.top)
    functions.update(script.functions)
    top = sorted(top + script.top, key=lambda u: u.line)
    findings: list[Finding] = []
    names = set(functions) | _external(path)
    all_uses = _flatten(top, functions) + [u for body in script.functions.values() for u in body]
    for u in all_uses:
        w = u.word
        if w in manifest or _is_installer(w) or _is_ours(w, names, built) or w in BASELINE:
            continue
        findings.append(Finding("unlisted", rel, u.line, w))
    if rel == INSTALLER:
        return _dedup(findings)
    # Order is execution order: the flattened sequence (function bodies expanded at their call), not line numbers.
    sequence = _flatten(top, functions)
    installed_at = next((k for k, u in enumerate(sequence) if _is_installer(u.word)), len(sequence))
    for u in sequence[:installed_at]:
        if u.word in manifest:
            findings.append(Finding("order", rel, u.line, u.word))
    return _dedup(findings)


def _dedup(findings: list[Finding]) -> list[Finding]:
    seen: set[tuple[str, str, str]] = set()
    out = []
    for f in findings:
        key = (f.kind, f.file, f.word)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def makefile_targets(text: str) -> dict[str, tuple[list[str], list[tuple[int, str]]]]:
    """target -> (prerequisites, recipe lines) of a Makefile (simple rules only, as ours are)."""
    rules: dict[str, tuple[list[str], list[tuple[int, str]]]] = {}
    current: list[str] = []
    lines = text.splitlines()
    joined: list[tuple[int, str]] = []
    for lineno, line in enumerate(lines, 1):
        if joined and joined[-1][1].endswith("\\"):
            joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line.strip())
        else:
            joined.append((lineno, line))
    for lineno, line in joined:
        if line.startswith("\t") and current:
            for t in current:
                rules[t][1].append((lineno, line[1:].lstrip("@-")))
            continue
        m = re.match(r"^([A-Za-z0-9_./ %$()-]+?)\s*:(?!=)\s*(.*)$", line)
        if m and not line.startswith((".PHONY", "#")):
            current = m.group(1).split()
            for t in current:
                rules[t] = (m.group(2).split(), [])
        elif line and not line.startswith("\t"):
            current = []
    return rules


# Targets that reach host tools (directly, or through scripts, pytest suites or kfcluster) must depend on
# host-deps: the install step then runs before anything they start.
TARGETS_NEEDING_HOST = ("test", "e2e-real", "e2e-elastic", "cluster-up", "images")


def check_makefile(manifest: dict[str, str], built: set[str]) -> list[Finding]:
    text = (REPO / "Makefile").read_text()
    rules = makefile_targets(text)
    # variables whose value names host-deps, e.g. REAL_NODE_DEPS := $(if $(REAL_NODE),host-deps)
    dep_vars = {m.group(1) for m in re.finditer(r"^([A-Za-z_]+)\s*[:?]?=.*\bhost-deps\b", text, re.M)}
    findings: list[Finding] = []

    def depends(target: str, seen: frozenset[str] = frozenset()) -> bool:
        prereqs = rules.get(target, ([], []))[0]
        if "host-deps" in prereqs or any(p.strip("$()") in dep_vars for p in prereqs):
            return True
        return any(depends(p, seen | {p}) for p in prereqs if p not in seen and "$" not in p)

    for target, (prereqs, recipe) in rules.items():
        needs = target in TARGETS_NEEDING_HOST
        for lineno, line in recipe:
            shell = re.sub(r"\$[({][^)}]*[)}]", "$V", line.replace("$$", "\0")).replace("\0", "$")
            for words in _split_commands(shell):
                w = _command_word(words)
                if not w or w.startswith("$(") or "$" in w:
                    continue
                if w in manifest:
                    needs = True
                elif not (_is_installer(w) or _is_ours(w, set(), built) or w in BASELINE):
                    findings.append(Finding("unlisted", "Makefile", lineno, w))
        if needs and target != "host-deps" and not depends(target):
            findings.append(Finding("target", "Makefile", 0, target))
    return _dedup(findings)


def built_binaries() -> set[str]:
    text = (REPO / "e2e" / "build" / "build.sh").read_text()
    m = re.search(r"^ALL=\(([^)]*)\)", text, re.M)
    return set(m.group(1).split()) if m else set()


def check_repo() -> list[Finding]:
    manifest = load_manifest()
    built = built_binaries()
    cache: dict[str, Script] = {}
    findings: list[Finding] = []
    for rel in _shell_files():
        findings.extend(check_script(rel, manifest, built, cache))
    findings.extend(check_makefile(manifest, built))
    return findings


if __name__ == "__main__":
    problems = check_repo()
    for f in problems:
        print(f)
    print(f"{len(problems)} problem(s)")
    sys.exit(1 if problems else 0)
