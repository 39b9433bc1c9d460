"""nvcc's own steps for one ``.cu``, in two chains that run at once, the host half cached.

nvcc runs its steps one after another: host preprocessing, cudafe++ (the host view), device
preprocessing, cicc, ptxas, fatbinary, then the host compile of cudafe++'s output, which includes
the fat binary's bytes. Two links of that order are data: cicc reads the module id cudafe++
writes, and the host compile embeds the fat binary. Here the module id is written beforehand (a
name of the unit, not of its content) and the fat binary's bytes go into an object of their own,
referenced from the host side by a symbol, so the chains

    host:   preprocess -> cudafe++ -> [host compile, unless cached]
    device: preprocess -> cicc -> ptxas -> fatbinary -> assemble the bytes

run side by side. The host object is cached by the host-side text cudafe++ produced, without its
line markers and the device bodies it keeps in ``#if 0`` blocks: an edit inside a kernel's body
runs the device chain and cudafe++, never the host compile.

The steps are nvcc's own (``nvcc --dryrun``) with only those two edits, so every flag keeps its
meaning; the wrapper that points the runtime at the bytes is derived once per toolchain from
nvcc's own output (:func:`derive_wrapper`). Anything outside the expected shape (several
architectures, relocatable device code, an unknown step, a path nvcc would quote ambiguously) gives
no plan, and the caller runs nvcc whole.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

SYMBOL_SLOT = "@FATBIN_SYMBOL@"
# what nvcc's dry run prints as variables its commands use (``"$CICC_PATH/cicc"``)
_VAR_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
# characters nvcc's dry-run quoting does not escape: a path with one cannot be parsed back
_UNSAFE = re.compile(r"[\"\\$`\n]")


@dataclass(frozen=True)
class Wrapper:
    """nvcc's embedded fat-binary file as a wrapper of an external symbol (:func:`derive_wrapper`)."""

    c_text: str  # C source with :data:`SYMBOL_SLOT` where the bytes' symbol goes
    section: str  # the section nvcc puts the bytes in


@dataclass
class SplitPlan:
    """The steps of one ``.cu``'s compile, as argument lists, and the files they pass on."""

    host_steps: list[list[str]]  # preprocess, cudafe++
    device_steps: list[list[str]]  # preprocess, cicc, ptxas, fatbinary, assemble
    host_compile: list[str]  # writes host_obj
    env: dict[str, str]  # the variables nvcc sets for its tools
    module_id: Path
    module_id_text: str
    cudafe_cpp: Path
    stub_c: Path
    fatbin_c: Path  # the wrapper the stub includes (written before the host chain runs)
    wrapper_text: str
    data_asm: Path
    data_asm_text: str
    host_obj: Path
    data_obj: Path


def unit_symbol(rel: str) -> str:
    """The fat binary's symbol for the unit at ``rel``: distinct per unit of a module, and not
    a function of its content (the host object is shared across edits of the device code)."""
    return "__cuda_agent_fatbin_" + hashlib.sha256(rel.encode()).hexdigest()[:16]


def unit_module_id(rel: str) -> str:
    """A module id in nvcc's shape (``_<hash>_<len>_<name>``), a function of the unit's path."""
    name = re.sub(r"[^A-Za-z0-9]", "_", Path(rel).name)
    return f"_{hashlib.sha256(rel.encode()).hexdigest()[:8]}_{len(name)}_{name}"


def dry_run(nvcc: str, args: list[str], env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """nvcc's variables and commands (shell text) for ``args`` (which include --dryrun)."""
    out = subprocess.run(
        [nvcc, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    variables: dict[str, str] = {}
    cmds: list[str] = []
    for line in out.stderr.splitlines():
        if not line.startswith("#$ "):
            continue
        text = line[3:].strip()
        m = _VAR_RE.match(text)
        if m and " " not in m.group(1):
            variables[m.group(1)] = m.group(2).strip()
        else:
            cmds.append(text)
    return variables, cmds


def _expand(arg: str, variables: dict[str, str]) -> str:
    for name, value in variables.items():
        arg = arg.replace("$" + name, value.strip('"'))
    return arg


def _out_of(argv: list[str]) -> str:
    return argv[argv.index("-o") + 1] if "-o" in argv[:-1] else ""


def plan(
    nvcc: str,
    cflags: list[str],
    src: Path,
    work: Path,
    rel: str,
    wrapper: Wrapper,
    env: dict[str, str],
) -> tuple[SplitPlan | None, str]:
    """The split steps of compiling ``src`` with ``cflags`` (intermediates under ``work``), or
    (None, why) when nvcc's steps are not the expected seven or a path cannot be parsed back."""
    host_obj, data_obj = work / "host.o", work / "fatbin.o"
    if any(_UNSAFE.search(s) for s in (*cflags, str(src), str(work))):
        return None, "a path or flag nvcc would quote ambiguously"
    args = [
        *cflags,
        "-c",
        str(src),
        "-o",
        str(host_obj),
        "--dryrun",
        "--keep",
        "--keep-dir",
        str(work),
    ]
    try:
        variables, cmds = dry_run(nvcc, args, env)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        return None, f"nvcc --dryrun failed: {e}"
    parsed = [[_expand(a, variables) for a in shlex.split(c)] for c in cmds]
    parsed = [p for p in parsed if p and Path(p[0]).name != "rm"]
    tools = [Path(p[0]).name for p in parsed]
    if tools.count("cudafe++") != 1 or tools.count("cicc") != 1 or tools.count("ptxas") != 1:
        return None, f"nvcc's steps are not one architecture's ({', '.join(tools)})"
    if tools.count("fatbinary") != 1 or len(parsed) != 7 or "nvlink" in tools:
        return None, f"unexpected steps ({', '.join(tools)})"
    if any(a in ("--device-c", "-c") for p in parsed if Path(p[0]).name == "fatbinary" for a in p):
        return None, "relocatable device code"
    pre_host = next((p for p in parsed if "-E" in p and _out_of(p).endswith(".cpp4.ii")), None)
    pre_dev = next((p for p in parsed if "-E" in p and _out_of(p).endswith(".cpp1.ii")), None)
    cudafe = parsed[tools.index("cudafe++")]
    cicc = parsed[tools.index("cicc")]
    ptxas = parsed[tools.index("ptxas")]
    fatbinary = parsed[tools.index("fatbinary")]
    final = next((p for p in parsed if "-c" in p and _out_of(p) == str(host_obj)), None)
    if pre_host is None or pre_dev is None or final is None:
        return None, "nvcc's preprocessing or host compile not found in its steps"

    def value(argv: list[str], flag: str) -> str | None:
        return argv[argv.index(flag) + 1] if flag in argv[:-1] else None

    mid = value(cudafe, "--module_id_file_name")
    gen_c = value(cudafe, "--gen_c_file_name")
    stub = value(cudafe, "--stub_file_name")
    embedded = [a for a in fatbinary if a.startswith("--embedded-fatbin=")]
    if not (mid and gen_c and stub and "--gen_module_id_file" in cudafe and len(embedded) == 1):
        return None, "cudafe++ or fatbinary arguments not as expected"
    if value(cicc, "--module_id_file_name") != mid:
        return None, "cicc does not read cudafe++'s module id"
    fatbin_c = Path(embedded[0].split("=", 1)[1])
    fatbin = fatbin_c.with_suffix("")  # x.fatbin.c -> x.fatbin
    # cicc writes the stub (cudafe++'s --stub_file_name is only the name it includes)
    written = value(cicc, "--stub_file_name") or stub
    stub_path = Path(written) if Path(written).is_absolute() else Path(gen_c).parent / written
    cudafe = [a for a in cudafe if a != "--gen_module_id_file"]
    fatbinary = [a for a in fatbinary if a not in embedded] + [f"--create={fatbin}"]
    symbol = unit_symbol(rel)
    asm = work / "fatbin.S"
    data_asm_text = (
        f'.section {wrapper.section}, "a"\n.align 8\n'
        f'.globl {symbol}\n.hidden {symbol}\n{symbol}:\n.incbin "{fatbin}"\n'
        '.section .note.GNU-stack,"",@progbits\n'
    )
    assemble = [final[0], "-c", "-x", "assembler", str(asm), "-o", str(data_obj)]
    return (
        SplitPlan(
            host_steps=[pre_host, cudafe],
            device_steps=[pre_dev, cicc, ptxas, fatbinary, assemble],
            host_compile=final,
            env={k: v.strip('"') for k, v in variables.items() if k in ("PATH", "LD_LIBRARY_PATH")},
            module_id=Path(mid),
            module_id_text=unit_module_id(rel),
            cudafe_cpp=Path(gen_c),
            stub_c=stub_path,
            fatbin_c=fatbin_c,
            wrapper_text=wrapper.c_text.replace(SYMBOL_SLOT, symbol),
            data_asm=asm,
            data_asm_text=data_asm_text,
            host_obj=host_obj,
            data_obj=data_obj,
        ),
        "",
    )


def script(steps: list[list[str]]) -> list[str]:
    """One ``sh`` command running ``steps`` in order, stopping at the first that fails."""
    return ["/bin/sh", "-c", "set -e\n" + "\n".join(shlex.join(s) for s in steps)]


def both_chains(p: SplitPlan, host_log: Path, device_log: Path) -> list[str]:
    """One ``sh`` command running the host and the device chain at once, each stopping at its
    first failing step, their output in ``host_log`` and ``device_log``. Exit status: 1 if the
    host chain failed, plus 2 if the device chain did. (One process tree: a confined run's
    sweep kills every process of its uid, so two confined runs of one uid cannot overlap.)"""

    def chain(steps: list[list[str]], log: Path) -> str:
        body = " && ".join(shlex.join(s) for s in steps)
        return f"( {body} ) > {shlex.quote(str(log))} 2>&1 &"

    return [
        "/bin/sh",
        "-c",
        "\n".join(
            [
                chain(p.host_steps, host_log),
                "h=$!",
                chain(p.device_steps, device_log),
                "d=$!",
                "wait $h; hr=$?",
                "wait $d; dr=$?",
                "exit $(( (hr != 0) + 2 * (dr != 0) ))",
            ]
        ),
    ]


def _read_regular(
    path: Path, tail: int | None = None, max_bytes: int | None = None
) -> bytes | None:
    """A file a confined process wrote, or None if it is missing, not a regular file (never
    followed through a link) or larger than ``max_bytes``; ``tail``: only its last bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or (max_bytes is not None and st.st_size > max_bytes):
            return None
        if tail is not None:
            f.seek(max(0, st.st_size - tail))
        return f.read()


def read_log(path: Path, cap: int = 1 << 20) -> str:
    """The tail (``cap`` bytes) of a log a confined chain wrote; never read through a link."""
    return (_read_regular(path, tail=cap) or b"").decode(errors="replace")


def derive_wrapper(fatbin_c_text: str) -> Wrapper | None:
    """nvcc's embedded fat-binary file turned into a wrapper of an external symbol
    (:data:`SYMBOL_SLOT`): its ``asm`` block of bytes removed and its array declaration made
    external and unsized. None when the text is not in the shape this expects."""
    asm = re.search(r'^asm\(\n(?:".*\\n"\n)+\);\n', fatbin_c_text, re.M)
    if asm is None:
        asm = re.search(r"^asm\((?:.|\n)*?\);\n", fatbin_c_text, re.M)
    decl = re.findall(r"extern const unsigned long long fatbinData\[\d+\];", fatbin_c_text)
    uses = re.findall(r"\bfatbinData\b", fatbin_c_text[asm.end() :] if asm else "")
    if asm is None or len(decl) != 1 or len(uses) != 2:
        return None
    section = re.search(r'"\.section ([^,"\\]+)', asm.group(0))
    if section is None:
        return None
    rest = fatbin_c_text[: asm.start()] + fatbin_c_text[asm.end() :]
    rest = rest.replace(
        decl[0],
        f'extern const unsigned long long {SYMBOL_SLOT}[] __attribute__((visibility("hidden")));',
    )
    rest = re.sub(r"\bfatbinData\b", SYMBOL_SLOT, rest)
    return Wrapper(rest, section.group(1))


def host_key(p: SplitPlan, toolchain_key: str, max_bytes: int = 256 << 20) -> str | None:
    """A key of what the host compile reads: cudafe++'s output and stub without line markers
    and ``#if 0`` blocks (device bodies), and the wrapper. None if a file is missing, not a
    regular file (never followed through a link), or larger than ``max_bytes``."""
    h = hashlib.sha256(toolchain_key.encode() + b"\0" + p.wrapper_text.encode() + b"\0")
    for path in (p.cudafe_cpp, p.stub_c):
        text = _read_regular(path, max_bytes=max_bytes)
        if text is None:
            return None
        skipping = False
        for line in text.split(b"\n"):
            if skipping:
                skipping = line != b"#endif"
                continue
            if line == b"#if 0":
                skipping = True
                continue
            if line.startswith(b"# ") and line[2:3].isdigit():
                continue
            h.update(line + b"\n")
        h.update(b"\0")
    return h.hexdigest()[:32]
