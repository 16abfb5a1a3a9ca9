"""BPF sources without Docker: detection, the object checks, the verifier's log, packaging."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from debian.debfile import DebFile

from builder import bpf_checks
from builder.bpf import BpfLayout, BpfProgram, compile_script, detect_bpf, host_verifier
from builder.bpf_btf import btf_from_file, resolve_vmlinux_btf
from builder.bpf_checks import check_object, known_program_section, parse_load_output
from builder.bpf_deb import assemble_debs, wrap_description
from builder.config import Settings
from builder.errors import InvalidInput

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
EPOCH = 1767225600

# What bookworm's bpftool printed when the host kernel refused an unchecked packet read.
REFUSED = """\
libbpf: prog 'peek': BPF program load failed: Permission denied
libbpf: prog 'peek': -- BEGIN PROG LOAD LOG --
0: R1=ctx() R10=fp0
; unsigned char *data = (void *)(long)ctx->data; @ bad.bpf.c:6
0: (61) r1 = *(u32 *)(r1 +0)          ; R1=pkt(r=0)
; return data[12] == 0x08 ? XDP_DROP : XDP_PASS; @ bad.bpf.c:7
1: (71) r1 = *(u8 *)(r1 +12)
invalid access to packet, off=12 size=1, R1(id=0,off=12,r=0)
R1 offset is outside of the packet
processed 2 insns (limit 1000000) max_states_per_insn 0 total_states 0 peak_states 0 mark_read 0
-- END PROG LOAD LOG --
libbpf: prog 'peek': failed to load: -13
libbpf: failed to load object 'bad.bpf.o'
Error: failed to load object file
"""


def make_elf(
    path: Path,
    sections: dict[str, tuple[int, bytes]],
    machine: int = 247,
    little: bool = True,
) -> Path:
    """Write a minimal ELF64 relocatable object with the given (flags, contents) sections."""
    order = "<" if little else ">"
    names = b"\0" + b"".join(n.encode() + b"\0" for n in [*sections, ".shstrtab"])
    body, offsets = bytearray(), []
    for _flags, data in sections.values():
        offsets.append(64 + len(body))
        body += data
    strtab_off = 64 + len(body)
    body += names
    shoff = 64 + len(body)
    header = b"\x7fELF" + bytes([2, 1 if little else 2, 1]) + bytes(9)
    header += struct.pack(
        order + "HHIQQQIHHHHHH",
        1,
        machine,
        1,
        0,
        0,
        shoff,
        0,
        64,
        0,
        0,
        64,
        len(sections) + 2,
        len(sections) + 1,
    )
    table = bytearray(64)  # the null section
    name_off = 1
    for (name, (flags, data)), off in zip(sections.items(), offsets, strict=True):
        table += struct.pack(
            order + "IIQQQQIIQQ", name_off, 1, flags, 0, off, len(data), 0, 0, 1, 0
        )
        name_off += len(name) + 1
    table += struct.pack(
        order + "IIQQQQIIQQ", name_off, 3, 0, 0, strtab_off, len(names), 0, 0, 1, 0
    )
    path.write_bytes(header + bytes(body) + bytes(table))
    return path


GOOD = {
    ".text": (6, b""),
    "xdp": (6, b"\xb7\x00\x00\x00\x02\x00\x00\x00\x95\x00\x00\x00\x00\x00\x00\x00"),
    "license": (3, b"GPL\0"),
    ".BTF": (0, b"\x9f\xeb\x01\x00"),
}


@pytest.mark.parametrize(
    ("example", "name", "programs"),
    [
        ("reuseport-balancer", "reuseport-balancer", ["reuseport_balancer.bpf.c"]),
        ("xdp-sport-random", "xdp-sport-random", ["xdp_sport_random.bpf.c"]),
    ],
)
def test_examples_are_bpf_sources(example: str, name: str, programs: list[str]) -> None:
    """Both examples are kind "bpf": name from their one program, version from VERSION."""
    layout = detect_bpf(EXAMPLES / example)
    assert layout is not None and layout.kind == "bpf"
    assert (layout.name, layout.upstream_version) == (name, "0.1.0")
    assert [p.source for p in layout.programs] == programs
    assert layout.license == "GPL"
    # the balancer's loopback test program has no SEC(): it is not a BPF source
    assert all("test/" not in p.source for p in layout.programs)


def test_xdp_example_carries_its_vmlinux_h() -> None:
    """The hand-written vmlinux.h is found; the balancer uses linux/bpf.h and carries none."""
    assert detect_bpf(EXAMPLES / "xdp-sport-random").vmlinux_headers == ["vmlinux.h"]
    assert detect_bpf(EXAMPLES / "reuseport-balancer").vmlinux_headers == []


@pytest.mark.parametrize("example", ["hello", "kbench", "vendornic-2.3.1"])
def test_kernel_modules_are_not_bpf(example: str) -> None:
    """A kernel module source is not taken for BPF programs."""
    assert detect_bpf(EXAMPLES / example) is None


def _tree(tmp_path: Path, dirname: str, files: dict[str, str]) -> Path:
    tree = tmp_path / dirname
    for rel, text in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    return tree


PROG = '#include <linux/bpf.h>\nSEC("xdp") int f(void *c) { return 2; }\n'


def test_plain_c_with_sec_and_name_version_directory(tmp_path: Path) -> None:
    """A .c file with SEC() is a program; NAME-VERSION in the directory name names it."""
    tree = _tree(tmp_path, "filters-1.4", {"a.c": PROG, "sub/b.bpf.c": PROG, "user.c": "int main;"})
    layout = detect_bpf(tree)
    assert (layout.name, layout.upstream_version) == ("filters", "1.4")
    assert [(p.source, p.stem, p.sections) for p in layout.programs] == [
        ("a.c", "a", ["xdp"]),
        ("sub/b.bpf.c", "b", ["xdp"]),
    ]


def test_flags_win_over_the_source(tmp_path: Path) -> None:
    """--name and --version override the directory name and VERSION file."""
    tree = _tree(tmp_path, "filters-1.4", {"a.bpf.c": PROG, "VERSION": "2.0\n"})
    layout = detect_bpf(tree, name="my-filters", version="3.1")
    assert (layout.name, layout.upstream_version) == ("my-filters", "3.1")


def test_missing_version_names_what_was_looked_for(tmp_path: Path) -> None:
    """Without a version anywhere the error says where moddeb looked and which flag helps."""
    tree = _tree(tmp_path, "probe", {"probe.bpf.c": PROG})
    with pytest.raises(InvalidInput) as err:
        detect_bpf(tree)
    assert "NAME-VERSION" in str(err.value) and "VERSION file" in str(err.value)
    assert err.value.hint == "pass --version"


def test_several_programs_need_a_name(tmp_path: Path) -> None:
    """Two programs and no NAME-VERSION directory: the error lists them and asks for --name."""
    tree = _tree(tmp_path, "progs", {"a.bpf.c": PROG, "b.bpf.c": PROG, "VERSION": "1"})
    with pytest.raises(InvalidInput) as err:
        detect_bpf(tree)
    assert "a.bpf.c, b.bpf.c" in str(err.value) and err.value.hint == "pass --name"


def test_two_sources_making_one_object_are_refused(tmp_path: Path) -> None:
    """x.c and x.bpf.c would both become x.bpf.o."""
    tree = _tree(tmp_path, "dup-1.0", {"x.c": PROG, "y/x.bpf.c": PROG})
    with pytest.raises(InvalidInput, match="same object x.bpf.o"):
        detect_bpf(tree)


def test_module_with_sec_macro_is_not_bpf(tmp_path: Path) -> None:
    """A kernel module that happens to use a SEC("...") macro stays a module."""
    tree = _tree(tmp_path, "m-1.0", {"m.c": 'MODULE_LICENSE("GPL");\nSEC("x") int a;\n'})
    assert detect_bpf(tree) is None


@pytest.mark.parametrize(
    ("section", "known"),
    [
        ("xdp", True),
        ("xdp.frags", True),
        ("xdp/devmap", True),
        ("sk_reuseport", True),
        ("sk_reuseport/migrate", True),
        ("tc", True),
        ("socket", True),
        ("socket/filter", True),
        ("kprobe/do_sys_open", True),
        ("tracepoint/syscalls/sys_enter_openat", True),
        ("fentry/tcp_v4_connect", True),
        ("cgroup/connect4", True),
        ("xdp_prog", False),
        ("kprobes/x", False),
        ("sk_reuseport/other", False),
        ("tc/ingress", False),
        ("maps", False),
    ],
)
def test_program_section_names(section: str, known: bool) -> None:
    """Section names are matched the way libbpf 1.1 matches them."""
    assert known_program_section(section) is known


def test_a_good_object_passes_every_check(tmp_path: Path) -> None:
    """EM_BPF ELF, .BTF, an xdp program and a license: four passed checks."""
    checks = check_object(make_elf(tmp_path / "ok.bpf.o", GOOD))
    assert [(c.name, c.status) for c in checks] == [
        ("elf", "passed"),
        ("btf", "passed"),
        ("programs", "passed"),
        ("license", "passed"),
    ]
    assert checks[2].detail == "xdp" and checks[3].detail == "GPL"


def test_a_host_object_is_not_bpf(tmp_path: Path) -> None:
    """An x86-64 object (machine 62) fails with what was expected."""
    (check,) = check_object(make_elf(tmp_path / "x.o", GOOD, machine=62))
    assert check.status == "failed" and "machine 62" in check.detail and "EM_BPF" in check.detail


def test_wrong_byte_order_is_refused(tmp_path: Path) -> None:
    """A big-endian object cannot go into a little-endian architecture's package."""
    (check,) = check_object(make_elf(tmp_path / "be.o", GOOD, little=False))
    assert check.status == "failed" and "little-endian" in check.detail


def test_missing_btf_unknown_section_and_no_license_fail(tmp_path: Path) -> None:
    """Each missing piece is its own failed check with a message that says how to fix it."""
    sections = {"xdp_prog": GOOD["xdp"]}
    checks = {c.name: c for c in check_object(make_elf(tmp_path / "bad.o", sections))}
    assert checks["btf"].status == "failed" and "-g" in checks["btf"].detail
    assert checks["programs"].status == "failed" and "'xdp_prog'" in checks["programs"].detail
    assert checks["license"].status == "failed" and 'SEC("license")' in checks["license"].detail


def test_not_an_elf_file(tmp_path: Path) -> None:
    """Garbage is reported, not crashed on."""
    (tmp_path / "junk.o").write_bytes(b"not an object")
    (check,) = check_object(tmp_path / "junk.o")
    assert check.status == "failed" and "not an ELF file" in check.detail


def test_verifier_log_is_extracted() -> None:
    """The summary names the program and the verifier's reason; the log is kept whole."""
    summary, text = parse_load_output(REFUSED)
    assert summary == (
        "program 'peek': BPF program load failed: Permission denied: "
        "R1 offset is outside of the packet"
    )
    assert "invalid access to packet, off=12 size=1" in text
    assert text.startswith("0: R1=ctx()") and "END PROG LOAD LOG" not in text


def test_load_result_for_another_kernel() -> None:
    """The boot test turns a guest's loadall output into the same check, naming its kernel."""
    check = bpf_checks.load_result("bad.bpf.o", 255, REFUSED, "6.1.0-57-amd64 under QEMU")
    assert check.status == "failed"
    assert check.detail.startswith("6.1.0-57-amd64 under QEMU's verifier rejected bad.bpf.o: ")
    ok = bpf_checks.load_result("ok.bpf.o", 0, "", "6.1.0-57-amd64 under QEMU", ["f"])
    assert (ok.status, ok.detail) == ("passed", "6.1.0-57-amd64 under QEMU loaded f")


def test_load_failure_without_verifier_log() -> None:
    """A refusal before the verifier (a missing kernel function, say) is still summarised."""
    summary, _ = parse_load_output("libbpf: failed to find BTF for extern 'x'\nError: failed\n")
    assert summary == "Error: failed"


def test_loadall_command_quotes_paths() -> None:
    """The command the boot test runs in its guest is safe to paste into a shell."""
    assert bpf_checks.loadall_command("/x/a b.o", "/sys/fs/bpf/m") == (
        "bpftool prog loadall '/x/a b.o' /sys/fs/bpf/m"
    )


def test_verifier_modes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """off: no verifier; host: a skipped load is a failure; anything else is refused."""
    assert host_verifier(Settings(bpf_verify="off")) is None
    with pytest.raises(InvalidInput):
        host_verifier(Settings(bpf_verify="qemu"))
    monkeypatch.setattr(bpf_checks.os, "geteuid", lambda: 1000)
    obj = make_elf(tmp_path / "ok.bpf.o", GOOD)
    auto = host_verifier(Settings(bpf_verify="auto"))(obj, tmp_path / "log")
    assert (auto.status, auto.detail) == ("skipped", "loading into the host kernel needs root")
    required = host_verifier(Settings(bpf_verify="host"))(obj, tmp_path / "log")
    assert required.status == "failed" and "bpf_verify=host" in required.detail


def test_struct_ops_never_go_into_the_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Loading struct_ops would register them in the build host's kernel: skipped."""
    monkeypatch.setattr(bpf_checks.os, "geteuid", lambda: 0)
    monkeypatch.setattr(bpf_checks.shutil, "which", lambda name: "/usr/sbin/bpftool")
    obj = make_elf(tmp_path / "cc.bpf.o", {**GOOD, "struct_ops/cong_avoid": GOOD["xdp"]})
    check = bpf_checks.verify_on_host(obj, tmp_path / "log")
    assert check.status == "skipped" and "struct_ops/cong_avoid" in check.detail


def _layout() -> BpfLayout:
    return BpfLayout(
        "reuseport-balancer",
        "0.1.0",
        [BpfProgram("reuseport_balancer.bpf.c", "reuseport_balancer", ["sk_reuseport"])],
        copyrights=["2026 moddeb authors"],
    )


def test_compile_script() -> None:
    """clang -target bpf with CO-RE flags, DWARF stripped, a STEM_bpf skeleton."""
    script = compile_script(_layout(), "amd64", generate_vmlinux=False)
    assert (
        "clang -target bpf -O2 -g -Wall -D__TARGET_ARCH_x86 -I/build/gen -I. -I/build/src "
        "-I/usr/include/x86_64-linux-gnu -c reuseport_balancer.bpf.c "
        "-o /build/out/obj/reuseport_balancer.bpf.o"
    ) in script
    assert "llvm-strip -g /build/out/obj/reuseport_balancer.bpf.o" in script
    assert (
        "bpftool gen skeleton /build/out/obj/reuseport_balancer.bpf.o name reuseport_balancer_bpf "
        "> /build/out/skel/reuseport_balancer.skel.h"
    ) in script
    assert "btf dump" not in script
    generated = compile_script(_layout(), "arm64", generate_vmlinux=True)
    assert "bpftool btf dump file /build/btf/vmlinux format c > /build/gen/vmlinux.h" in generated
    assert "-D__TARGET_ARCH_arm64" in generated and "/usr/include/aarch64-linux-gnu" in generated


def _settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home", maintainer_name="Unit Tester")


def _debs(tmp_path: Path, out: str) -> list[Path]:
    obj = make_elf(tmp_path / "reuseport_balancer.bpf.o", GOOD)
    skel = tmp_path / "reuseport_balancer.skel.h"
    skel.write_text("/* skeleton */\n")
    (tmp_path / out).mkdir()
    return assemble_debs(
        _settings(tmp_path), _layout(), [obj], [skel], tmp_path / out, "amd64", EPOCH
    ).paths


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is not installed")
def test_packages_layout(tmp_path: Path) -> None:
    """Objects under the multiarch bpf dir with libxdp1's override; skeletons in -dev."""
    runtime, dev = _debs(tmp_path, "out")
    assert runtime.name == "reuseport-balancer-bpf_0.1.0-1_amd64.deb"
    assert dev.name == "reuseport-balancer-bpf-dev_0.1.0-1_amd64.deb"
    deb = DebFile(str(runtime))
    files = {str(n) for n in deb.data.tgz().getnames()}
    assert "./usr/lib/x86_64-linux-gnu/bpf/reuseport_balancer.bpf.o" in files
    override = deb.data.get_content("./usr/share/lintian/overrides/reuseport-balancer-bpf")
    assert b"reuseport-balancer-bpf: binary-from-other-architecture [usr/lib/*/bpf/*.o]" in override
    control = deb.debcontrol()
    assert (control["Architecture"], control["Multi-Arch"]) == ("amd64", "same")
    assert "  reuseport_balancer.bpf.o" in control["Description"]
    dev_deb = DebFile(str(dev))
    assert "./usr/include/x86_64-linux-gnu/reuseport-balancer/reuseport_balancer.skel.h" in {
        str(n) for n in dev_deb.data.tgz().getnames()
    }
    assert dev_deb.debcontrol()["Depends"] == "libbpf-dev"
    copyright_text = deb.data.get_content("./usr/share/doc/reuseport-balancer-bpf/copyright")
    assert b"Copyright: 2026 moddeb authors" in copyright_text and b"GPL-2" in copyright_text


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is not installed")
def test_packages_are_reproducible(tmp_path: Path) -> None:
    """The same objects, settings and date give byte-identical packages."""
    first = [p.read_bytes() for p in _debs(tmp_path, "a")]
    second = [p.read_bytes() for p in _debs(tmp_path, "b")]
    assert first == second


@pytest.mark.skipif(shutil.which("lintian") is None, reason="lintian is not installed")
def test_packages_are_lintian_clean(tmp_path: Path) -> None:
    """lintian finds no error (the BPF ELF tag is overridden the way libxdp1 does)."""
    debs = _debs(tmp_path, "out")
    proc = subprocess.run(["lintian", *map(str, debs)], capture_output=True, text=True)
    assert [ln for ln in proc.stdout.splitlines() if ln.startswith("E:")] == []


def test_description_is_rewrapped() -> None:
    """Ordinary paragraphs are wrapped under 80 columns; verbatim lines are kept."""
    text = "synopsis\n " + "word " * 40 + "\n .\n   verbatim  line"
    wrapped = wrap_description(text).split("\n")
    assert wrapped[0] == "synopsis" and wrapped[-1] == "   verbatim  line"
    assert all(len(line) <= 79 for line in wrapped)


RAW_BTF = b"\x9f\xeb\x01\x00\x18\x00\x00\x00" + bytes(16)


def _vmlinux(tmp_path: Path) -> Path:
    return make_elf(tmp_path / "vmlinux", {".text": (6, b"\x90" * 32), ".BTF": (2, RAW_BTF)}, 62)


@pytest.mark.parametrize("kind", ["raw", "elf", "gzip", "xz", "zstd"])
def test_kernel_btf_is_found_in_every_form(tmp_path: Path, kind: str) -> None:
    """Raw BTF, a vmlinux, and a vmlinuz whose compressed kernel follows a boot stub."""
    import gzip as gz
    import lzma

    elf = _vmlinux(tmp_path).read_bytes()
    stub = b"MZ boot stub \x1f\x8b\x08 not a stream " + bytes(64)
    if kind == "raw":
        data = RAW_BTF
    elif kind == "elf":
        data = elf
    elif kind == "gzip":
        data = stub + gz.compress(elf) + b"trailer"
    elif kind == "xz":
        data = stub + lzma.compress(elf, format=lzma.FORMAT_XZ) + b"trailer"
    else:
        if shutil.which("zstd") is None:
            pytest.skip("zstd is not installed")
        packed = subprocess.run(["zstd", "-q", "-c"], input=elf, capture_output=True).stdout
        data = stub + packed + b"trailer"
    (tmp_path / "kernel").write_bytes(data)
    assert btf_from_file(tmp_path / "kernel") == RAW_BTF


def test_a_file_without_btf_is_refused(tmp_path: Path) -> None:
    """A kernel built without BTF, or any other file, is reported with what would work."""
    make_elf(tmp_path / "vmlinux", {".text": (6, b"\x90")}, 62)
    with pytest.raises(InvalidInput, match="holds no kernel BTF"):
        btf_from_file(tmp_path / "vmlinux")


def test_vmlinux_btf_setting(tmp_path: Path) -> None:
    """ "" keeps the source's vmlinux.h; a missing file and a bad kernel release are refused."""
    settings = _settings(tmp_path)
    assert resolve_vmlinux_btf(settings, None, tmp_path) is None  # type: ignore[arg-type]
    settings.bpf_vmlinux_btf = str(tmp_path / "nope")
    with pytest.raises(InvalidInput, match="not a file"):
        resolve_vmlinux_btf(settings, None, tmp_path)  # type: ignore[arg-type]
    settings.bpf_vmlinux_btf = "linux-image-6.1; rm -rf /"
    with pytest.raises(InvalidInput, match="not a kernel release"):
        resolve_vmlinux_btf(settings, None, tmp_path)  # type: ignore[arg-type]
    settings.bpf_vmlinux_btf = str(_vmlinux(tmp_path))
    assert resolve_vmlinux_btf(settings, None, tmp_path).read_bytes() == RAW_BTF  # type: ignore[arg-type]
