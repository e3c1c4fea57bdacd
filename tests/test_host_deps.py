"""The fresh-machine guard (e2e/host/check.py): every host tool our scripts call is installed by the one install step
(e2e/host/install.sh, from e2e/host/packages.txt) before its first use, and the tool list is complete.

The repository itself must be clean; the rest feeds small scripts to the checker, including the shape of the bug it
exists for (up.sh ran pre-up.sh, which calls iptables, before the packages were installed).
"""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

import kfcluster.testing

_SPEC = importlib.util.spec_from_file_location(
    "hostdeps_check", pathlib.Path(__file__).resolve().parents[1] / "e2e" / "host" / "check.py")
assert _SPEC and _SPEC.loader
check = importlib.util.module_from_spec(_SPEC)
sys.modules["hostdeps_check"] = check
_SPEC.loader.exec_module(check)

MANIFEST = "containerd  containerd ctr\niptables  iptables iptables-save\nbusybox-static  busybox\n"
INSTALL = "#!/usr/bin/env bash\nset -euo pipefail\necho ok\n"


def test_the_repository_has_no_findings() -> None:
    findings = check.check_repo()
    assert not findings, "\n".join(map(str, findings))


def test_the_manifest_names_a_package_for_every_tool() -> None:
    tools = check.load_manifest()
    assert {"iptables", "containerd", "runc", "busybox", "ip"} <= set(tools)
    assert tools["iptables"] == "iptables" and tools["/usr/lib/cni/bridge"] == "containernetworking-plugins"


@pytest.fixture
def repo(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    """A scratch repository with the layout the checker reads (manifest, installer, build list, Makefile)."""
    (tmp_path / "e2e" / "host").mkdir(parents=True)
    (tmp_path / "e2e" / "build").mkdir(parents=True)
    (tmp_path / "e2e" / "node").mkdir(parents=True)
    (tmp_path / "e2e" / "host" / "packages.txt").write_text(MANIFEST)
    (tmp_path / "e2e" / "host" / "install.sh").write_text(INSTALL)
    (tmp_path / "e2e" / "build" / "build.sh").write_text("ALL=(kubelet kubectl)\n")
    (tmp_path / "Makefile").write_text("host-deps:\n\tbash e2e/host/install.sh\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    monkeypatch.setattr(check, "REPO", tmp_path)
    monkeypatch.setattr(check, "MANIFEST", tmp_path / "e2e" / "host" / "packages.txt")
    yield tmp_path


def _write(repo: pathlib.Path, rel: str, text: str) -> None:
    (repo / rel).write_text("#!/usr/bin/env bash\nset -euo pipefail\n" + text)


def _findings(repo: pathlib.Path) -> list[tuple[str, str, str]]:
    return sorted((f.kind, f.file, f.word) for f in check.check_repo())


def test_a_tool_used_before_the_install_step_is_found(repo: pathlib.Path) -> None:
    _write(repo, "e2e/node/a.sh", 'iptables -S\n"$HERE/../host/install.sh"\n')
    assert _findings(repo) == [("order", "e2e/node/a.sh", "iptables")]
    _write(repo, "e2e/node/a.sh", '"$HERE/../host/install.sh"\niptables -S\n')
    assert _findings(repo) == []


def test_the_original_bug_fails_the_guard(repo: pathlib.Path) -> None:
    """up.sh called pre-up.sh (iptables) and only then installed the packages; pre-up.sh never installed them."""
    _write(repo, "e2e/node/lib.sh", "kf_log() { echo \"$*\" >&2; }\n")
    _write(repo, "e2e/node/pre-up.sh", 'source "$(dirname "$0")/lib.sh"\niptables -w -N KUBEFORGE-NODE\n')
    _write(repo, "e2e/node/up.sh", 'source "$HERE/lib.sh"\nensure_packages() {\n  command -v iptables || '
           'apt-get install -y iptables\n}\nmain() {\n  "$HERE/pre-up.sh" "$1"\n  ensure_packages\n}\nmain "$@"\n')
    assert ("order", "e2e/node/pre-up.sh", "iptables") in _findings(repo)
    assert ("order", "e2e/node/up.sh", "iptables") in _findings(repo)  # the probe in ensure_packages is a use too


def test_a_tool_used_inside_a_library_function_counts_where_it_is_called(repo: pathlib.Path) -> None:
    _write(repo, "e2e/node/lib.sh", "kf_ctr() {\n  ctr --address x \"$@\"\n}\n"
           'kf_deps() { "$KF_REPO/e2e/host/install.sh" >&2; }\n')
    _write(repo, "e2e/node/up.sh", 'source "$HERE/lib.sh"\nkf_ctr images ls\nkf_deps\n')
    assert _findings(repo) == [("order", "e2e/node/up.sh", "ctr")]
    _write(repo, "e2e/node/up.sh", 'source "$HERE/lib.sh"\nmain() {\n  kf_deps\n  kf_ctr images ls\n}\nmain\n')
    assert _findings(repo) == []


def test_a_tool_neither_listed_nor_on_a_fresh_machine_is_found(repo: pathlib.Path) -> None:
    _write(repo, "e2e/node/a.sh", '"$HERE/../host/install.sh"\nconntrack -F\nsort x | uniq\n')
    assert _findings(repo) == [("unlisted", "e2e/node/a.sh", "conntrack")]
    (repo / "e2e" / "host" / "packages.txt").write_text(MANIFEST + "conntrack  conntrack\n")
    assert _findings(repo) == []


def test_a_declared_external_tool_is_allowed(repo: pathlib.Path) -> None:
    _write(repo, "e2e/node/a.sh", "# host-deps: external docker: only on machines with Docker\ndocker ps\n")
    assert _findings(repo) == []


def test_a_make_target_that_reaches_host_tools_must_depend_on_host_deps(repo: pathlib.Path) -> None:
    (repo / "Makefile").write_text("host-deps:\n\tbash e2e/host/install.sh\n"
                                   "venv:\n\ttrue\ntest: venv\n\tpython3 -m pytest\nlint:\n\tiptables -S\n")
    assert _findings(repo) == [("target", "Makefile", "lint"), ("target", "Makefile", "test")]
    (repo / "Makefile").write_text("host-deps:\n\tbash e2e/host/install.sh\nDEPS := $(if $(X),host-deps)\n"
                                   "venv: host-deps\n\ttrue\ntest: venv\n\tpython3 -m pytest\nlint: $(DEPS)\n\t"
                                   "iptables -S\n")
    assert _findings(repo) == []


@pytest.mark.parametrize(("line", "commands"), [
    ('a "$(b --x)" | c', ["b", "a", "c"]),
    ("x=$(ip addr show dev \"$BR\") y=1 grep -q z <<<\"$(ss -Hlnu)\"", ["ip", "ss", "grep"]),
    ("[ -f f ] && { echo hi >&2; tail -n 3 f >&2; }", ["[", "echo", "tail"]),
    ("[[ -x a && -f b ]] || die 'no (a)'", ["die"]),
    ("find . -exec rm -rf {} + 2>/dev/null", ["find"]),
    ("for ((i = 0; i < 3; i++)); do sleep 1; done", ["sleep"]),
    ("mapfile -t p < <(cut -d' ' -f1 <<<\"$m\")", ["cut", "mapfile"]),
    ("exec 8>&- ; timeout 5 nsenter -t 1 ip link", ["exec", "timeout"]),
    ('case "$x" in \'\'|\'#\'*) continue ;; *[!0-9]*) busybox ;; esac', ["continue", "busybox"]),
    ("echo \"$((SECONDS - T0)) s\" # comment; iptables", ["echo"]),
])
def test_the_shell_reader_finds_the_commands(line: str, commands: list[str]) -> None:
    lexer = check._Lexer()
    got = [check._command_word(words) for words in lexer.split(line)]
    want_first = {"exec": None, "timeout": "nsenter"}
    assert [g for g in got if g] == [want_first.get(c, c) for c in commands if want_first.get(c, c)]


def test_here_documents_are_text_but_their_substitutions_run(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "s.sh"
    script.write_text("cat >f <<EOF\nmode: iptables\nname: $(hostname)\nEOF\ncat <<'EOF'\n$(runc)\nEOF\ndone_it\n")
    words = [u.word for u in check.parse(script).top]
    assert words == ["cat", "hostname", "cat", "done_it"]


def test_api_numbers_compare_as_numbers() -> None:
    """JSON carries no int/float distinction: a mean reward of exactly 1.0 comes back from the API as 1."""
    assert kfcluster.testing.api_number(1, field="meanReward") == 1.0
    assert kfcluster.testing.api_number(0.25) == 0.25
    for bad in (True, "1.0", None):
        with pytest.raises(AssertionError):
            kfcluster.testing.api_number(bad)


@pytest.mark.realnode
def test_the_install_step_left_every_prerequisite_present() -> None:
    """`make test` runs `make host-deps` first; afterwards `install.sh --check` finds nothing missing."""
    out = subprocess.run(["bash", str(check.REPO / "e2e" / "host" / "install.sh"), "--check"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("host prerequisites present")
