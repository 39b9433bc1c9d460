"""Compile a workdir solution into ``cuda_extension.so``: parallel, cached by content hash.

Units: ``kernels/*.cu`` (nvcc, device arch only, no torch headers needed), ``kernels/*_binding.cpp``
and the infrastructure ``binding.cpp`` (host compiler with the torch/pybind prelude force-included,
optionally precompiled), other ``kernels/*.cpp`` (host compiler, -O3). Each object is cached under
``CACHE/objects`` by a key over the toolchain fingerprint, the unit's text and every header of the
solution and the infrastructure; the linked module is cached by the keys of its objects. So a
change to one ``.cu`` recompiles only that file, and an unchanged solution links nothing.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from cuda_agent.records.filelock import exclusive_lock

from . import nvcc_split
from .isolation import Limits, Outcome, cap_text, prepare_writable, run_confined, sandbox_uid
from .toolchain import READ_ALSO_ENV, Flags, flags_for, torch_info

HEADER_EXT = (".h", ".hpp", ".cuh", ".inl", ".hh")
TEMPLATE = Path(__file__).with_name("template")
PRELUDE = "sandbox_prelude.h"
# stand-ins for the umbrella headers (template/standin/torch/*.h): searched first by a binding
# that includes one; if it does not compile so, it is compiled again with the real header
STANDIN = TEMPLATE / "standin"


@dataclass
class Unit:
    kind: str  # "cuda" | "binding" | "main" | "kernel"
    src: Path
    rel: str
    key: str = ""
    obj: Path | None = None
    cached: bool = False
    seconds: float = 0.0
    ok: bool = True
    log: str = ""
    timed_out: bool = False
    heavy: tuple[str, ...] = ()  # umbrella headers a binding includes (see heavy_includes)
    frontend: bool = False  # names the C++ frontend (see uses_cpp_frontend)
    # bindings with umbrella includes: "stand-in", "real (stand-in failed)" or "real (C++ frontend)"
    headers: str = ""
    parts: list[Path] = field(default_factory=list)  # objects linked besides ``obj`` (a split .cu)
    # a .cu: "split (host cached)", "split", "whole" or "whole (<why not split>)"
    nvcc: str = ""


@dataclass
class BuildResult:
    """Outcome of one build. ``log`` is the compilers' output (capped), ``units`` per-file facts."""

    ok: bool
    so_path: Path | None
    log: str
    seconds: float
    cached: bool
    timed_out: bool = False
    units: list[dict[str, object]] = field(default_factory=list)
    pch: str = "off"  # off | on | rejected (the compiler did not use it) | failed | unused (...)
    link_seconds: float = 0.0  # 0 when the module came from the cache
    link_stubs: bool = False  # linked against stand-ins of torch's libraries (ensure_link_stubs)
    # who the compilers and the linker of this build ran as; "" when none ran (all cached)
    compilers_as: str = ""


def _who(uid: int | None) -> str:
    return "leased unprivileged uids" if uid is not None else "the evaluator's user"


class ObjectCache:
    """Content-addressed store of objects, modules and precompiled headers under ``root``;
    ``read_also``: another such store whose entries are used (never written) when ``root`` lacks
    them."""

    def __init__(
        self, root: str | os.PathLike[str], read_also: str | os.PathLike[str] | None = None
    ):
        self.root = Path(root)
        self.read_also = Path(read_also) if read_also else None
        (self.root / "objects").mkdir(parents=True, exist_ok=True)
        (self.root / "modules").mkdir(parents=True, exist_ok=True)
        (self.root / "pch").mkdir(parents=True, exist_ok=True)

    def existing(self, p: Path) -> Path:
        """``p`` (a path under ``root``), or the ``read_also`` store's copy when only it has one."""
        if self.read_also is None or p.exists():
            return p
        alt = self.read_also / p.relative_to(self.root)
        return alt if alt.exists() else p

    def obj_path(self, key: str) -> Path:
        return self.root / "objects" / key[:2] / f"{key}.o"

    def module_path(self, key: str) -> Path:
        return self.root / "modules" / key[:2] / f"{key}.so"

    def put(self, tmp: Path, dest: Path) -> None:
        """Move ``tmp`` into the cache atomically. Across file systems (a confined tool command
        sees the cache as another mount) it is copied next to ``dest`` first, then renamed.
        A file a confined compiler (another uid) wrote becomes this process's first: no later
        process of that uid may change what the cache holds."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        if os.lstat(tmp).st_uid != os.geteuid():
            os.chown(tmp, os.geteuid(), os.getegid())
            os.chmod(tmp, os.lstat(tmp).st_mode & 0o755)
        try:
            os.replace(tmp, dest)
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
            staged = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
            shutil.copy2(tmp, staged)
            os.replace(staged, dest)
            os.unlink(tmp)

    @contextlib.contextmanager
    def lock(self, name: str):
        with exclusive_lock(self.root / f".{name}.lock"):
            yield


def build_cache(cache_root: Path) -> ObjectCache:
    """The build cache under a sandbox cache root; inside ``sandbox exec``
    (``$CUDA_AGENT_SANDBOX_READ_CACHE``) it also reads the trusted evaluation's build cache."""
    shared = os.environ.get(READ_ALSO_ENV)
    return ObjectCache(cache_root / "build", read_also=Path(shared) / "build" if shared else None)


def _sha(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:32]


def collect_units(src_dir: Path, backend: str) -> tuple[list[Unit], list[str]]:
    """Units of a materialised workdir and problems that make it unbuildable (e.g. a .cu on cpu)."""
    units = [Unit("main", src_dir / "binding.cpp", "binding.cpp")]
    problems: list[str] = []
    kdir = src_dir / "kernels"
    files = sorted(p for p in kdir.rglob("*") if p.is_file()) if kdir.is_dir() else []
    for p in files:
        rel = str(p.relative_to(src_dir))
        if p.suffix == ".cu":
            if backend != "cuda":
                problems.append(f"{rel}: .cu files need the cuda backend (cpu backend: use .cpp)")
                continue
            units.append(Unit("cuda", p, rel))
        elif p.suffix in (".cpp", ".cc", ".cxx"):
            units.append(Unit("binding" if p.stem.endswith("_binding") else "kernel", p, rel))
    if not any(u.rel.startswith("kernels/") for u in units):
        problems.append("no kernels/*.cpp or kernels/*.cu sources")
    return units, problems


def _deps_digest(src_dir: Path) -> str:
    parts: list[bytes] = []
    for p in sorted(src_dir.rglob("*")):
        if p.is_file() and p.suffix in HEADER_EXT:
            parts += [str(p.relative_to(src_dir)).encode(), p.read_bytes()]
    parts.append((TEMPLATE / PRELUDE).read_bytes())
    return _sha(*parts)


# cpu backend: the precompiled prelude (about 45 s to build on a 2-core host, 0.5 GB) is built
# once a cache has compiled this many bindings without it (about 26 s each there, 10 s with it):
# a handful of evaluations never pay for it, a test suite or a run pays once
PCH_AFTER_ENV = "CUDA_AGENT_PCH_AFTER"
PCH_AFTER_DEFAULT = 3


def pch_after() -> int:
    """Bindings a cpu-backend cache compiles without the precompiled prelude before building it
    (``$CUDA_AGENT_PCH_AFTER``, default 3; 0: at once)."""
    v = os.environ.get(PCH_AFTER_ENV, "").strip()
    if not v:
        return PCH_AFTER_DEFAULT
    if not v.isdigit():  # a negative or non-integer count is a mistake, not 0
        raise ValueError(f"{PCH_AFTER_ENV}={v!r}: expected a whole number")
    return int(v)


def _pch_dir(cache: ObjectCache, flags: Flags) -> Path:
    return cache.root / "pch" / flags.key


def _unprecompiled_path(cache: ObjectCache, flags: Flags) -> Path:
    return cache.root / "pch" / f"{flags.key}.bindings-without"


def _pch_failed_path(cache: ObjectCache, flags: Flags) -> Path:
    return cache.root / "pch" / f"{flags.key}.failed"


def unprecompiled_bindings(cache: ObjectCache, flags: Flags) -> int:
    """How many bindings ``cache`` has compiled for ``flags`` without a precompiled prelude
    (one byte appended per binding: concurrent builds each count)."""
    try:
        return _unprecompiled_path(cache, flags).stat().st_size
    except FileNotFoundError:
        return 0


def _count_unprecompiled(cache: ObjectCache, flags: Flags, n: int) -> None:
    if n <= 0 or cache.read_also is not None:  # a tools cache never builds the prelude
        return
    with contextlib.suppress(OSError), open(_unprecompiled_path(cache, flags), "ab") as fh:
        fh.write(b"." * n)


def pch_wanted(cache: ObjectCache, flags: Flags, pch: bool | None) -> tuple[bool, str]:
    """Whether a build in ``cache`` uses the precompiled prelude, and the state to report when it
    does not. ``pch`` None: always on the cuda backend; on the cpu backend when ``cache`` (or the
    trusted cache it reads) has one, or has compiled :func:`pch_after` bindings without one (a
    tools cache never builds it)."""
    if pch is not None:
        return pch, "on" if pch else "off"
    if flags.backend == "cuda":
        return True, "on"
    if cache.existing(_pch_dir(cache, flags) / (PRELUDE + ".gch")).exists():
        return True, "on"
    if _pch_failed_path(cache, flags).exists():
        return False, "off (cpu: building it failed in this cache; see pch/*.failed)"
    done, after = unprecompiled_bindings(cache, flags), pch_after()
    if done >= after and cache.read_also is None:
        return True, "on"
    return False, f"off (cpu: built after {after} bindings in this cache, {done} so far)"


def ensure_pch(cache: ObjectCache, flags: Flags, limits: Limits) -> tuple[Path | None, str]:
    """The precompiled prelude for ``flags`` (built once under a lock); (dir, note)."""
    d = _pch_dir(cache, flags)
    gch = cache.existing(d / (PRELUDE + ".gch"))
    if gch.exists():
        return gch.parent, "pch: cached"
    if cache.read_also is not None:
        # a tools cache (``sandbox exec``): the prelude is about 0.5 GB, and one per workspace
        # would fill disks in an RL run; the trusted cache gets it when a workspace is made
        # (execute.prepare_trusted_cache)
        return (
            None,
            "pch: none in the trusted cache, not built for one workspace: parsing the prelude",
        )
    gch = d / (PRELUDE + ".gch")
    with cache.lock(f"pch-{flags.key}"):
        if gch.exists():
            return d, "pch: cached"
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(TEMPLATE / PRELUDE, d / PRELUDE)
        tmp = d / f"{PRELUDE}.gch.{uuid.uuid4().hex[:8]}"
        cmd = [
            flags.cxx,
            *flags.binding_cflags,
            "-x",
            "c++-header",
            str(d / PRELUDE),
            "-o",
            str(tmp),
        ]
        lim = Limits(
            **{**limits.__dict__, "timeout_s": max(limits.timeout_s, 600.0), "drop_user": False}
        )
        t0 = time.monotonic()
        out = run_confined(cmd, cwd=d, env=_compiler_env(d), limits=lim, writable=[d])
        if out.returncode == 0 and tmp.exists():
            os.replace(tmp, gch)
            return d, f"pch: built in {time.monotonic() - t0:.1f}s"
        with contextlib.suppress(OSError):
            tmp.unlink()
        if flags.backend != "cuda":  # the cpu backend's is optional: not tried on every build
            with contextlib.suppress(OSError):
                _pch_failed_path(cache, flags).write_text(out.stderr[-4000:])
        return None, "pch: build failed, compiling without it: " + out.stderr[-500:]


SPLIT_ENV = "CUDA_AGENT_NVCC_SPLIT"  # "0": every .cu compiled by nvcc whole
_PROBE_CU = """#include <cuda_runtime.h>
__global__ void cuda_agent_probe(float* x) { x[threadIdx.x] *= 2.0f; }
extern "C" void cuda_agent_probe_launch(float* x, cudaStream_t s) { cuda_agent_probe<<<1, 32, 0, s>>>(x); }
"""


def split_enabled() -> bool:
    """Whether ``.cu`` units are compiled as nvcc's steps in two chains (:mod:`nvcc_split`)."""
    return os.environ.get(SPLIT_ENV, "1") != "0"


def ensure_split_wrapper(cache: ObjectCache, flags: Flags) -> tuple[nvcc_split.Wrapper | None, str]:
    """The fat-binary wrapper for ``flags``'s nvcc, derived once per toolchain from nvcc's own
    output for a probe kernel and checked: the probe compiled split must give the same fat
    binary as nvcc whole. (None, why) when it cannot be derived or the check fails: every ``.cu``
    is then compiled whole."""
    d = cache.root / "nvcc-split"
    rec = cache.existing(d / f"{flags.key}.json")
    if rec.exists():
        try:
            data = json.loads(rec.read_text())
            w = data.get("wrapper")
            return (nvcc_split.Wrapper(**w) if w else None), data.get("why", "")
        except (OSError, ValueError, TypeError) as e:
            return None, f"unreadable split record {rec}: {e}"
    if cache.read_also is not None:  # a tools cache: the trusted one derives it
        return None, "no split wrapper in the trusted cache"
    assert flags.nvcc is not None
    d.mkdir(parents=True, exist_ok=True)
    with cache.lock(f"nvcc-split-{flags.key}"):
        rec = d / f"{flags.key}.json"
        if rec.exists():
            return ensure_split_wrapper(cache, flags)
        work = d / f"probe-{uuid.uuid4().hex[:8]}"
        whole, split = work / "whole", work / "split"
        whole.mkdir(parents=True)
        split.mkdir()
        (work / "probe.cu").write_text(_PROBE_CU)
        env = _compiler_env(work)
        wrapper, why = None, ""
        try:
            cmd = [flags.nvcc, *flags.cuda_cflags, "-c", str(work / "probe.cu")]
            out = subprocess.run(
                [*cmd, "-o", str(whole / "probe.o"), "--keep", "--keep-dir", str(whole)],
                capture_output=True,
                text=True,
                env=env,
                timeout=300,
                check=False,
            )
            fatc = whole / "probe.fatbin.c"
            if out.returncode != 0 or not fatc.exists():
                why = f"probe did not compile: {out.stderr[-300:]}"
            elif (wrapper := nvcc_split.derive_wrapper(fatc.read_text())) is None:
                why = "nvcc's fat-binary file is not in the expected shape"
            else:
                p, why = nvcc_split.plan(
                    flags.nvcc,
                    list(flags.cuda_cflags),
                    work / "probe.cu",
                    split,
                    "probe.cu",
                    wrapper,
                    env,
                )
                if p is not None:
                    _write_split_inputs(p)
                    steps = [*p.host_steps, *p.device_steps, p.host_compile]
                    res = subprocess.run(
                        nvcc_split.script(steps),
                        capture_output=True,
                        text=True,
                        env={**env, **p.env},
                        timeout=300,
                        check=False,
                    )
                    same = (
                        res.returncode == 0
                        and (whole / "probe.fatbin").exists()
                        and p.fatbin_c.with_suffix("").read_bytes()
                        == (whole / "probe.fatbin").read_bytes()
                    )
                    if not same:
                        why = (
                            "the probe compiled split did not give nvcc's fat binary: "
                            + (res.stderr[-300:])
                        )
                if why:
                    wrapper = None
        except (OSError, subprocess.TimeoutExpired) as e:
            # perhaps passing (a full disk, a machine too busy): not recorded, tried next build
            return None, f"probe failed: {e}"
        finally:
            shutil.rmtree(work, ignore_errors=True)
        tmp = d / f".{flags.key}.{uuid.uuid4().hex[:8]}"
        tmp.write_text(json.dumps({"wrapper": wrapper.__dict__ if wrapper else None, "why": why}))
        os.replace(tmp, rec)
        return wrapper, why


def _write_split_inputs(p: nvcc_split.SplitPlan) -> None:
    """Create the files a split compile reads besides the source (module id, fat-binary wrapper,
    assembler file), never through a link nor over an existing file: the directory is the
    compiler uid's."""
    for path, text in (
        (p.module_id, p.module_id_text),
        (p.fatbin_c, p.wrapper_text),
        (p.data_asm, p.data_asm_text),
    ):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(text)


def _split_parts(cache: ObjectCache, key: str) -> tuple[Path, list[Path]]:
    """A ``.cu`` unit's cached objects: (main, others). A split unit's main object is its fat
    binary's and a side file names its host object; a whole one has no side file."""
    main = cache.existing(cache.obj_path(key))
    side = cache.existing(cache.obj_path(key).with_suffix(".host"))
    if not side.exists():
        return main, []
    host = cache.existing(cache.obj_path(side.read_text().strip()))
    return main, [host]


def _soname(lib: Path) -> str:
    """``lib``'s DT_SONAME (via readelf, part of the binutils every GNU-style link needs), else
    its file name (which is what the loader would look for anyway)."""
    try:
        out = subprocess.run(
            ["readelf", "-d", str(lib)], capture_output=True, text=True, timeout=60
        )
        m = re.search(r"\(SONAME\)[^\[]*\[([^\]]+)\]", out.stdout)
        return m.group(1) if m else lib.name
    except (OSError, subprocess.TimeoutExpired):
        return lib.name


def ensure_link_stubs(cache: ObjectCache, flags: Flags) -> Path | None:
    """A directory of symbol-less stand-ins for ``flags.link_stubs`` (torch's libraries, each
    with the real library's soname), built once per flags key; None when off or not buildable.

    A module linked with this directory first in its search path records the same DT_NEEDED
    names, and the loader binds its undefined symbols to the real libraries (found by rpath or
    already loaded by ``import torch``) exactly as for a module linked against them: linking a
    shared object never requires its symbols to be defined. What it saves is the linker reading
    libtorch's symbol tables, most of a 0.5-0.7 s link with GNU ld."""
    if not flags.link_stubs:
        return None
    d = cache.root / "linkstubs" / flags.key
    if (done := cache.existing(d / ".done")).exists():
        return done.parent
    tmp = d.with_name(f".{d.name}.{uuid.uuid4().hex[:8]}")
    try:
        with cache.lock(f"linkstubs-{flags.key}"):
            if (d / ".done").exists():
                return d
            tmp.mkdir(parents=True)
            if not _write_link_stubs(tmp, flags):
                return None
            (tmp / ".done").touch()
            shutil.rmtree(d, ignore_errors=True)
            os.replace(tmp, d)
            return d
    except (OSError, subprocess.TimeoutExpired):
        return None  # e.g. a read-only cache: link against the real libraries
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_link_stubs(dest: Path, flags: Flags) -> bool:
    libdirs = [Path(x) for x in torch_info()["lib"]]  # type: ignore[union-attr]
    for name in flags.link_stubs:
        real = next((p / f"lib{name}.so" for p in libdirs if (p / f"lib{name}.so").exists()), None)
        if real is None:
            return False  # an unusual torch install: link against whatever -l finds
        cmd = [flags.cxx, "-shared", "-x", "c", os.devnull, "-nostdlib"]
        cmd += [f"-Wl,-soname,{_soname(real)}", "-o", str(dest / real.name)]
        if subprocess.run(cmd, capture_output=True, timeout=120).returncode != 0:
            return False
    return True


def pch_rejection(log: str) -> str | None:
    """GCC's reason for not using a precompiled header (its ``-Winvalid-pch`` warning), or None.

    A rejected PCH is silently replaced by parsing the prelude again (about twice the time), so a
    build says so in ``BuildResult.pch`` instead of reporting the PCH as used."""
    for line in log.splitlines():
        if "[-Winvalid-pch]" in line or ".gch: not used because" in line:
            return line.split("warning:", 1)[-1].strip()[:300]
    return None


# umbrella headers the precompiled prelude does not cover: a binding including one parses it
# again on every compile (torch/extension.h: about 19 s instead of 8 on a 2-core host)
HEAVY_INCLUDES = ("torch/extension.h", "torch/torch.h", "torch/all.h")
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


# names only the real umbrella header declares (the C++ frontend): a binding using one goes
# straight to the real header instead of failing against the stand-in first
_FRONTEND_RE = re.compile(r"\btorch::(nn|optim|data|serialize|jit|autograd)::")


def heavy_includes(text: str) -> list[str]:
    """The :data:`HEAVY_INCLUDES` a source includes (in order, once each)."""
    found = [h for h in _INCLUDE_RE.findall(text) if h in HEAVY_INCLUDES]
    return list(dict.fromkeys(found))


def uses_cpp_frontend(text: str) -> bool:
    """Whether a source names the C++ frontend (``torch::nn::``, ``optim``, ``data``, ...),
    which only the real umbrella header declares."""
    return _FRONTEND_RE.search(text) is not None


def _compiler_env(tmp: Path) -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["TMPDIR"] = str(tmp)
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    return env


@contextlib.contextmanager
def _scratch(out: Path, limits: Limits, uid: int | None):
    """A fresh directory under ``out`` that only a compiler process of ``uid`` (None: this
    process's user) writes; removed afterwards."""
    d = out / f".scratch-{uuid.uuid4().hex[:10]}"
    if uid is None:
        d.mkdir(parents=True)
    else:
        prepare_writable(d, limits=limits, uid=uid)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _unit_cmd(
    u: Unit, flags: Flags, out: Path, src_dir: Path, pch_dir: Path | None, standin: bool = False
) -> list[str]:
    inc = [f"-I{src_dir}", f"-I{src_dir / 'kernels'}"]
    if u.kind == "cuda":
        assert flags.nvcc is not None
        return [flags.nvcc, *flags.cuda_cflags, *inc, "-c", str(u.src), "-o", str(out)]
    if u.kind == "binding":
        prelude = str((pch_dir or TEMPLATE) / PRELUDE)
        pch_flags = ["-Winvalid-pch"] if pch_dir else []
        return [
            flags.cxx,
            *([f"-I{STANDIN}"] if standin else []),  # before torch's include directories
            *flags.binding_cflags,
            *pch_flags,
            "-include",
            prelude,
            *inc,
            "-c",
            str(u.src),
            "-o",
            str(out),
        ]
    if u.kind == "main":  # the module definition needs pybind11 only
        return [flags.cxx, *flags.main_cflags, *inc, "-c", str(u.src), "-o", str(out)]
    return [flags.cxx, *flags.kernel_cflags, *inc, "-c", str(u.src), "-o", str(out)]


def _compile_split(
    u: Unit,
    flags: Flags,
    wrapper: nvcc_split.Wrapper,
    src_dir: Path,
    scratch: Path,
    uid: int | None,
    limits: Limits,
    deadline: float,
    cache: ObjectCache,
    deps: str,
) -> bool:
    """Compile the ``.cu`` unit ``u`` as nvcc's steps in two chains (:mod:`nvcc_split`), confined
    like nvcc whole; sets ``u``'s outcome and caches its objects. False (nothing done) when
    nvcc's steps are not in the shape the split needs: compile it whole then. ``deps``: the
    digest of the solution's headers, part of the host object's key (the host compile searches
    the solution's directories too: a header there named like one of the toolkit's would be
    compiled in)."""
    assert flags.nvcc is not None and u.obj is not None
    env = _compiler_env(scratch)
    inc = [f"-I{src_dir}", f"-I{src_dir / 'kernels'}"]
    p, why = nvcc_split.plan(
        flags.nvcc, [*flags.cuda_cflags, *inc], u.src, scratch, u.rel, wrapper, env
    )
    if p is None:
        u.nvcc = f"whole ({why})"
        return False
    try:
        _write_split_inputs(p)
    except OSError as e:
        u.nvcc = f"whole (could not write the split's files: {e})"
        return False
    env = {**env, **p.env}
    u.nvcc = "split"

    def confined(cmd: list[str]) -> Outcome:
        lim = Limits(**{**limits.__dict__, "timeout_s": max(0.1, deadline - time.monotonic())})
        return run_confined(cmd, cwd=src_dir, env=env, limits=lim, writable=[scratch], uid=uid)

    # both chains in one confined run: its sweep kills every process of the uid, so two runs
    # of one uid cannot overlap. cicc writes the stub the host compile includes (the kernels'
    # registration): the host object's key is known once both chains are done
    host_log, dev_log = scratch / "host-chain.log", scratch / "device-chain.log"
    both = confined(nvcc_split.both_chains(p, host_log, dev_log))
    rc = both.returncode
    if rc == 0:  # both logs (warnings)
        logs = [nvcc_split.read_log(host_log), nvcc_split.read_log(dev_log)]
    elif rc is None or rc & 1:  # as nvcc whole: the first failing step's log alone
        logs = [nvcc_split.read_log(host_log)]
    else:
        logs = [nvcc_split.read_log(dev_log)]
    logs.append(both.stdout + both.stderr)
    host_obj: Path | None = None
    hk = ""
    failed: Outcome | None = both if rc != 0 else None
    if rc == 0:
        # None only for an unreadable or huge output: cached under this unit alone then
        hk = nvcc_split.host_key(p, _sha(flags.key, deps)) or _sha(u.key, "host")
        cached = cache.existing(cache.obj_path(hk))
        if cached.exists():
            host_obj, u.nvcc = cached, "split (host cached)"
        else:
            hc = confined(nvcc_split.script([p.host_compile]))
            logs.append(hc.stdout + hc.stderr)
            if hc.returncode == 0 and p.host_obj.exists():
                host_obj = cache.obj_path(hk)
                cache.put(p.host_obj, host_obj)
            else:
                failed = hc
    u.log = "".join(logs).strip()
    if failed is not None or host_obj is None or not p.data_obj.exists():
        u.ok = False
        if failed is not None:
            u.timed_out = failed.timed_out
            if failed.killed_for:
                u.log += f"\n[{failed.describe()}]"
        return True
    side = cache.obj_path(u.key).with_suffix(".host")
    side.parent.mkdir(parents=True, exist_ok=True)
    tmp = side.with_name(f".{side.name}.{uuid.uuid4().hex[:8]}")
    tmp.write_text(hk)
    os.replace(tmp, side)
    cache.put(p.data_obj, u.obj)
    u.parts = [host_obj]
    return True


def build_workdir(
    src_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    backend: str,
    cache: ObjectCache,
    jobs: int = 4,
    timeout_s: float = 300.0,
    pch: bool | None = None,
    limits: Limits | None = None,
) -> BuildResult:
    """Build ``src_dir`` (a materialised workdir) into ``out_dir/cuda_extension.so``.

    ``pch``: precompile the bindings' torch/pybind prelude. None: always on the cuda backend; on
    the cpu backend once ``cache`` has compiled :func:`pch_after` bindings without it (building
    it costs more than a handful of bindings save), and from then on.
    ``limits.drop_user`` (the evaluation sets it; default off): compilers and the linker run as
    leased unprivileged uids where this process is root, so ``src_dir`` must be reachable by
    other users.
    Never raises for a bad solution: compiler errors, a missing source or the time limit give
    ``ok=False`` with the log. All units share one wall-clock budget of ``timeout_s``.
    """
    t0 = time.monotonic()
    src = Path(src_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = limits or Limits(drop_user=False)
    units, problems = collect_units(src, backend)
    if problems:
        return BuildResult(False, None, "\n".join(problems), time.monotonic() - t0, False)
    if backend == "cuda" and flags_for("cuda").nvcc is None:
        return BuildResult(
            False, None, "nvcc not found (set CUDA_HOME)", time.monotonic() - t0, False
        )
    b = _Build(src, out, backend, cache, base, flags_for(backend), _deps_digest(src), t0)
    split = backend == "cuda" and split_enabled()
    _key_units(b, units, split)
    infra_s = _prepare_pch(b, units, pch)
    _prepare_split(b, units, split)
    b.deadline = t0 + infra_s + timeout_s
    todo = _compile_units(b, units, jobs)
    b.notes += _header_notes(todo)
    _check_pch_used(b, units)
    logs = [
        f"== {u.rel} ({u.kind}){' [cached]' if u.cached else f' {u.seconds:.1f}s'}\n{u.log}".rstrip()
        for u in units
        if u.log or not u.ok
    ]
    facts = [_unit_facts(u) for u in units]
    if not all(u.ok for u in units):
        timed_out = any(u.timed_out for u in units)
        head = f"compile time limit ({timeout_s:.0f}s) exceeded\n" if timed_out else ""
        return b.result(False, None, head + "\n".join(b.notes + logs), facts, timed_out=timed_out)
    return _link(b, units, logs, facts)


@dataclass
class _Build:
    """What the steps of one :func:`build_workdir` share: its inputs, the toolchain, and what
    the steps decide (precompiled prelude, split nvcc, the deadline, notes, who ran)."""

    src: Path
    out: Path
    backend: str
    cache: ObjectCache
    base: Limits  # the compilers' limits, but for the time limit (from ``deadline``)
    flags: Flags
    deps: str  # digest of the solution's and the infrastructure's headers
    t0: float
    deadline: float = 0.0
    pch_dir: Path | None = None
    pch_state: str = "off"
    wrapper: nvcc_split.Wrapper | None = None
    notes: list[str] = field(default_factory=list)
    ran_as: set[str] = field(default_factory=set)  # who the compilers and the linker ran as

    def result(
        self,
        ok: bool,
        so: Path | None,
        log: str,
        units: list[dict[str, object]],
        *,
        cached: bool = False,
        timed_out: bool = False,
        link_seconds: float = 0.0,
        link_stubs: bool = False,
    ) -> BuildResult:
        """The build's result, its time counted from the start and its shared facts filled in."""
        return BuildResult(
            ok,
            so,
            log,
            time.monotonic() - self.t0,
            cached,
            timed_out,
            units,
            self.pch_state,
            link_seconds,
            link_stubs,
            " and ".join(sorted(self.ran_as)),
        )


def _key_units(b: _Build, units: list[Unit], split: bool) -> None:
    """Each unit's cache key (toolchain, kind, text, headers, stand-ins, split), its object
    paths and whether they are all cached; a binding's umbrella includes and C++ frontend use."""
    standin_key = _sha(*(f.read_bytes() for f in sorted(STANDIN.rglob("*.h"))))
    for u in units:
        text = u.src.read_bytes()
        if u.kind == "binding":
            decoded = text.decode(errors="replace")
            u.heavy = tuple(heavy_includes(decoded))
            u.frontend = uses_cpp_frontend(decoded)
        u.key = _sha(
            b.flags.key,
            u.kind,
            text,
            b.deps if u.kind != "cuda" else _sha(b.deps, "cu"),
            standin_key if u.kind == "binding" else "",
            "split" if u.kind == "cuda" and split else "",
        )
        if u.kind == "cuda":
            u.obj, u.parts = _split_parts(b.cache, u.key)
        else:
            u.obj = b.cache.existing(b.cache.obj_path(u.key))
        u.cached = u.obj.exists() and all(p.exists() for p in u.parts)


def _prepare_pch(b: _Build, units: list[Unit], pch: bool | None) -> float:
    """Decide on the precompiled prelude (``b.pch_state``) and, when wanted and a binding is to
    be compiled, have it (``b.pch_dir``; None if it failed); returns the seconds that took,
    which are the toolchain's, not the candidate's budget."""
    want, b.pch_state = pch_wanted(b.cache, b.flags, pch)
    if want:
        b.pch_state = "unused (bindings cached)"
    if not (want and any(u.kind == "binding" and not u.cached for u in units)):
        return 0.0
    tp = time.monotonic()
    b.pch_dir, note = ensure_pch(b.cache, b.flags, b.base)
    infra_s = time.monotonic() - tp  # built here, or waited for while another process did
    b.notes.append(note)
    b.pch_state = "on" if b.pch_dir else "failed"
    return infra_s


def _prepare_split(b: _Build, units: list[Unit], split: bool) -> None:
    """With the split on and a ``.cu`` to compile, the split's wrapper (``b.wrapper``); when it
    cannot be had, every ``.cu`` is marked to compile whole, saying why."""
    if not (split and any(u.kind == "cuda" and not u.cached for u in units)):
        return
    b.wrapper, why = ensure_split_wrapper(b.cache, b.flags)
    if b.wrapper is None:
        for u in units:
            if u.kind == "cuda":
                u.nvcc = f"whole ({why})"


def _compile_units(b: _Build, units: list[Unit], jobs: int) -> list[Unit]:
    """Compile the units not cached, ``jobs`` at a time, slowest first; returns them. On the cpu
    backend without the prelude, counts the bindings compiled (:func:`pch_wanted`)."""
    todo = [u for u in units if not u.cached]
    # slowest first: bindings, then CUDA, then plain C++
    todo.sort(key=lambda u: {"binding": 0, "main": 1, "cuda": 2, "kernel": 3}[u.kind])
    if todo:
        with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(todo)))) as ex:
            list(ex.map(functools.partial(_compile_unit, b), todo))
    if b.pch_dir is None and b.backend != "cuda":
        _count_unprecompiled(b.cache, b.flags, sum(u.kind == "binding" for u in todo))
    return todo


def _compile_unit(b: _Build, u: Unit) -> None:
    """Compile the uncached unit ``u`` into the object cache (a ``.cu`` split where it can be),
    setting its outcome, time and log."""
    lim0 = Limits(**{**b.base.__dict__, "address_space_mb": None})
    # the compiler reads the candidate's source, which may name any file (#include of an
    # absolute path), and its errors go back to the agent: it runs as a leased unprivileged
    # uid where one is dropped to, writing only a scratch directory of its own
    with sandbox_uid(lim0) as uid, _scratch(b.out, lim0, uid) as scratch:
        b.ran_as.add(_who(uid))
        standin = bool(u.heavy) and os.environ.get("CUDA_AGENT_STANDIN", "1") != "0"
        if standin and u.frontend:  # it would fail against the stand-in: skip that attempt
            standin, u.headers = False, "real (C++ frontend)"
        t = time.monotonic()
        if u.kind == "cuda" and b.wrapper is not None:
            if _compile_split(
                u, b.flags, b.wrapper, b.src, scratch, uid, lim0, b.deadline, b.cache, b.deps
            ):
                u.seconds = time.monotonic() - t
                return
        elif u.kind == "cuda" and not u.nvcc:
            u.nvcc = "whole"
        _compile_whole(b, u, scratch, uid, lim0, standin, t)


def _compile_whole(
    b: _Build, u: Unit, scratch: Path, uid: int | None, lim0: Limits, standin: bool, t: float
) -> None:
    """Compile ``u`` whole within the deadline (a binding with umbrella includes first against
    the stand-ins, ``standin``, then, if that fails, against the real headers); its object into
    the cache, or ``u`` failed with the compiler's log. ``t``: when its compile started (a unit
    not started for want of time keeps no seconds)."""
    tmp = scratch / "unit.o"
    while True:
        cmd = _unit_cmd(u, b.flags, tmp, b.src, b.pch_dir, standin)
        left = b.deadline - time.monotonic()
        if left <= 0:
            u.ok, u.timed_out = False, True
            u.log = "not started: compile time limit reached"
            return
        lim = Limits(**{**lim0.__dict__, "timeout_s": left})
        res = run_confined(
            cmd,
            cwd=b.src,
            env=_compiler_env(scratch),
            limits=lim,
            writable=[scratch],
            uid=uid,
        )
        if standin and (res.returncode != 0 or not tmp.exists()) and not res.timed_out:
            standin, u.headers = False, "real (stand-in failed)"
            continue  # needs more than the prelude declares: the real headers decide
        if standin:
            u.headers = "stand-in"
        break
    u.seconds = time.monotonic() - t
    u.log = (res.stdout + res.stderr).strip()
    if res.returncode == 0 and tmp.exists():
        b.cache.put(tmp, u.obj)  # type: ignore[arg-type]
    else:
        u.ok = False
        u.timed_out = res.timed_out
        if res.killed_for:
            u.log += f"\n[{res.describe()}]"


def _header_notes(todo: list[Unit]) -> list[str]:
    """A note for each compiled binding with umbrella includes: which headers it was compiled
    with, and what that costs."""
    notes: list[str] = []
    for u in todo:
        if not u.heavy:
            continue
        inc = "<" + ">, <".join(u.heavy) + ">"
        if u.headers == "stand-in":
            notes.append(
                f"note: {u.rel} includes {inc}: compiled with the sandbox's stand-in (the"
                " precompiled prelude's headers), not the umbrella header."
            )
        elif u.headers == "real (C++ frontend)":
            notes.append(
                f"note: {u.rel} uses the C++ frontend (torch::nn, optim, ...): compiled with the"
                f" real {inc}, parsed again on every compile of this file (more than twice the"
                " time of a binding without it)."
            )
        else:
            notes.append(
                f"note: {u.rel} includes {inc} and needs more than the precompiled prelude"
                " declares: compiled with the real header, parsed again on every compile of this"
                " file (more than twice the time). Include <torch/types.h> and"
                " <torch/csrc/utils/pybind.h> (plus what you use) instead."
            )
    return notes


def _check_pch_used(b: _Build, units: list[Unit]) -> None:
    """``b.pch_state`` ``rejected``, with a note, when the compiler refused the precompiled
    prelude (the bindings then parsed it)."""
    if b.pch_dir is None:
        return
    why = next((w for u in units if u.kind == "binding" and (w := pch_rejection(u.log))), None)
    if why:
        b.pch_state = "rejected"
        b.notes.append(f"pch: rejected by the compiler, bindings parsed the prelude: {why}")


def _unit_facts(u: Unit) -> dict[str, object]:
    """The per-file facts a build reports of ``u``."""
    return {
        "file": u.rel,
        "kind": u.kind,
        "cached": u.cached,
        "seconds": round(u.seconds, 3),
        "ok": u.ok,
        **({"headers": u.headers} if u.headers else {}),
        **({"nvcc": u.nvcc} if u.nvcc else {}),
    }


def _link(
    b: _Build, units: list[Unit], logs: list[str], facts: list[dict[str, object]]
) -> BuildResult:
    """Link the objects (the module cached by the objects' keys and the libraries asked for)
    and copy the module to ``out/cuda_extension.so``; the build's result."""
    text = "".join(u.src.read_text(errors="replace") for u in units if u.kind != "binding")
    extra: list[str] = []
    if b.backend == "cuda":
        if re.search(r"cublas", text, re.I):
            extra += ["-lcublas", "-lcublasLt"]
        if re.search(r"cudnn", text, re.I):
            extra += ["-lcudnn"]
    mkey = _sha(b.flags.key, *sorted(u.key for u in units), *extra)
    mod = b.cache.existing(b.cache.module_path(mkey))
    all_cached = all(u.cached for u in units) and mod.exists()
    link_s = 0.0
    linked_stubs = False
    if not mod.exists():
        tl = time.monotonic()
        stubs = ensure_link_stubs(b.cache, b.flags)
        failed = _link_module(b, units, extra, stubs, mod, logs, facts)
        if failed is not None:
            return failed
        link_s = time.monotonic() - tl
        linked_stubs = stubs is not None
    so = b.out / "cuda_extension.so"
    with contextlib.suppress(FileNotFoundError):
        so.unlink()
    shutil.copyfile(mod, so)
    os.chmod(so, 0o755)
    log = cap_text("\n".join(b.notes + logs), 16000)
    return b.result(
        True, so, log, facts, cached=all_cached, link_seconds=link_s, link_stubs=linked_stubs
    )


def _link_module(
    b: _Build,
    units: list[Unit],
    extra: list[str],
    stubs: Path | None,
    mod: Path,
    logs: list[str],
    facts: list[dict[str, object]],
) -> BuildResult | None:
    """Run the linker (confined like the compilers, within what is left of the deadline) and
    put the module at ``mod`` in the cache; the failed build's result when it did not link."""
    # binding.cpp first: of the inline pybind11 code every object carries, the linker keeps
    # the first copy, i.e. its -O1 one (see toolchain.flags_for)
    objs = [str(o) for u in units for o in (u.obj, *u.parts)]
    # searched first: -l of torch's libraries finds the stand-ins
    search = [f"-L{stubs}"] if stubs else []
    left = max(1.0, b.deadline - time.monotonic())
    lim = Limits(**{**b.base.__dict__, "timeout_s": left})
    with sandbox_uid(lim) as uid, _scratch(b.out, lim, uid) as scratch:
        b.ran_as.add(_who(uid))
        tmp = scratch / "module.so"
        cmd = [b.flags.cxx, *objs, *search, *b.flags.ldflags, *extra, "-o", str(tmp)]
        res = run_confined(
            cmd, cwd=b.src, env=_compiler_env(scratch), writable=[scratch], limits=lim, uid=uid
        )
        if res.returncode != 0 or not tmp.exists():
            log = "\n".join(b.notes + logs + ["== link", (res.stdout + res.stderr).strip()])
            return b.result(False, None, log, facts, timed_out=res.timed_out)
        b.cache.put(tmp, mod)
    return None
