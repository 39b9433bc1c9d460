"""Compilers, flags and the target device: everything that goes into an object's cache key.

Queried once per process and cached. Nothing here imports torch at module level.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

# a trusted cache whose entries are read (never written) where this process's own lacks them:
# what an agent's tool commands get, pointing at the evaluation's cache
READ_ALSO_ENV = "CUDA_AGENT_SANDBOX_READ_CACHE"


def _read_fact(name: str) -> object | None:
    """A recorded fact ``name`` (JSON) from this process's cache, else from the trusted one it
    may read ($CUDA_AGENT_SANDBOX_READ_CACHE), else None."""
    dirs = [default_cache_dir()]
    if os.environ.get(READ_ALSO_ENV):
        dirs.append(Path(os.environ[READ_ALSO_ENV]))
    for d in dirs:
        with contextlib.suppress(OSError, ValueError):
            return json.loads((d / "toolchain" / name).read_text())
    return None


def write_atomic(path: Path, data: bytes, dir_mode: int = 0o777) -> None:
    """Write ``path`` (mode 0644) through a temporary file renamed over it, so a reader sees
    the old content or the new, never part of it; its directories are made with ``dir_mode``
    (less the umask). A place it cannot write is left alone."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(mode=dir_mode, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_bytes(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)


def _write_fact(name: str, value: object, root: Path | None = None) -> None:
    """Record ``value`` as fact ``name`` in ``root``'s toolchain directory (default: this
    process's cache), atomically; a cache it cannot write is left alone."""
    write_atomic((root or default_cache_dir()) / "toolchain" / name, json.dumps(value).encode())


def _torch_fact() -> str | None:
    """The name of the fact that holds this torch installation's :func:`torch_info`."""
    key = _torch_install_key()
    return f"torch-{key}.json" if key else None


def _gpu_fact() -> str | None:
    """The name of the fact that holds this boot's (and visible devices') GPU capability."""
    key = _boot_key()
    return f"gpu-{key}.json" if key else None


def _torch_install_key() -> str | None:
    """A key of the torch installation this interpreter would import, found without importing
    it: its package directory and the size and mtime of the files that change with a
    reinstall (None when torch is not found)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    pkg = Path(spec.origin).parent
    h = hashlib.sha256(f"{os.path.realpath(sys.executable)}\0{pkg.resolve()}\0".encode())
    files = [pkg / "__init__.py", pkg / "version.py", *sorted(pkg.glob("_C*.so")), pkg / "lib"]
    for f in files:
        try:
            st = f.stat()
        except OSError:
            return None
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:24]


def _torch_info_imported() -> dict[str, object]:
    import torch
    import torch.utils.cpp_extension as ce

    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "include": ce.include_paths(),
        "lib": ce.library_paths(),
        "cxx11_abi": int(bool(torch._C._GLIBCXX_USE_CXX11_ABI)),
    }


@functools.lru_cache(maxsize=1)
def torch_info() -> dict[str, object]:
    """torch's version, include and library dirs and C++ ABI flag. Imports torch the first
    time per installation; later processes read what it gave from the cache
    (``<cache>/toolchain/torch-<key>.json``, keyed by the installation: a compile tool then
    starts in a fraction of a second instead of importing torch, 2.5-4 s)."""
    name = _torch_fact()
    got = _read_fact(name) if name else None
    with contextlib.suppress(KeyError, TypeError):
        dirs = [*got["include"], *got["lib"]]  # type: ignore[index]
        if all(isinstance(d, str) and Path(d).is_dir() for d in dirs):
            return got  # type: ignore[return-value]
    info = _torch_info_imported()
    if name:
        _write_fact(name, info)
    return info


def python_include() -> str:
    return sysconfig.get_paths()["include"]


@functools.lru_cache(maxsize=8)
def tool_version(exe: str) -> str:
    """First line of ``exe --version`` (part of every cache key); '' if it cannot run."""
    try:
        p = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
        lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
        return " | ".join(lines[-2:]) if "nvcc" in exe else (lines[0] if lines else "")
    except (OSError, subprocess.TimeoutExpired):
        return ""


def cxx() -> str:
    return os.environ.get("CXX") or shutil.which("g++") or "c++"


FAST_LINKERS = ("mold", "lld", "gold")  # preferred order; each must pass a probe link


@functools.lru_cache(maxsize=4)
def fast_linker(compiler: str, candidates: tuple[str, ...] = FAST_LINKERS) -> str | None:
    """The first of ``candidates`` with which ``compiler -fuse-ld=NAME`` links a shared object,
    else ``None`` (the compiler's default linker). Linking a module against libtorch takes about
    0.6 s with GNU ld and 0.3 s with gold: a large part of a warm build (only the .cu changed).
    ``$CUDA_AGENT_LINKER`` forces one (``default``: the compiler's own; ``fast``: probe)."""
    forced = os.environ.get("CUDA_AGENT_LINKER")
    if forced and forced != "fast":
        return None if forced == "default" else forced
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ld-probe-") as d:
        src = Path(d) / "p.c"  # C: the probe is about the linker, cc1 starts faster
        src.write_text("int probe_fn(int x) { return x + 1; }\n")
        for name in candidates:
            if not shutil.which(f"ld.{name}"):
                continue
            try:
                p = subprocess.run(
                    [compiler, "-shared", "-fPIC", f"-fuse-ld={name}", str(src), "-o", f"{d}/p.so"],
                    capture_output=True,
                    timeout=60,
                )
            except (OSError, subprocess.TimeoutExpired):
                continue
            if p.returncode == 0 and (Path(d) / "p.so").exists():
                return name
    return None


@functools.lru_cache(maxsize=1)
def cuda_home() -> str | None:
    """The CUDA toolkit root: $CUDA_HOME/$CUDA_PATH, nvcc's parent, /usr/local/cuda — the first
    that has include/cuda_runtime.h and bin/nvcc."""
    cands = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    w = shutil.which("nvcc")
    if w:
        cands.append(str(Path(w).resolve().parent.parent))
    cands += ["/usr/local/cuda"]
    for c in cands:
        if (
            c
            and (Path(c) / "include" / "cuda_runtime.h").exists()
            and (Path(c) / "bin" / "nvcc").exists()
        ):
            return str(Path(c).resolve())
    return None


@functools.lru_cache(maxsize=1)
def nvcc() -> str | None:
    """Path of nvcc in :func:`cuda_home` (else on PATH)."""
    h = cuda_home()
    if h:
        return str(Path(h) / "bin" / "nvcc")
    return shutil.which("nvcc")


def cuda_include_dirs() -> list[str]:
    h = cuda_home()
    if not h:
        return []
    dirs = [Path(h) / "include", Path(h) / "targets" / "x86_64-linux" / "include"]
    return [str(d) for d in dirs if d.exists()]


def cuda_lib_dirs() -> list[str]:
    h = cuda_home()
    if not h:
        return []
    dirs = [Path(h) / "lib64", Path(h) / "targets" / "x86_64-linux" / "lib", Path(h) / "lib"]
    return [str(d) for d in dirs if d.exists()]


def _boot_key() -> str | None:
    """A key of this machine since its last boot (its GPUs cannot have changed within one), or
    None where the kernel does not say."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    seen = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    return hashlib.sha256(f"{os.uname().nodename}\0{boot}\0{seen}".encode()).hexdigest()[:24]


@functools.lru_cache(maxsize=1)
def device_capability() -> tuple[int, int] | None:
    """Compute capability of the first visible GPU, or ``None`` without a GPU. Asked of
    nvidia-smi (torch in a subprocess as a fallback) once per boot of the machine: later
    processes read the answer from the cache (nvidia-smi takes seconds where the driver is not
    kept loaded); "no GPU" is not kept. ``$CUDA_AGENT_ARCH`` (e.g. ``9.0``) overrides it, to cross-compile."""
    env_arch = os.environ.get("CUDA_AGENT_ARCH")  # e.g. "9.0" to cross-compile without a GPU
    if env_arch:
        a, b = env_arch.split(".")
        return int(a), int(b)
    name = _gpu_fact()
    got = _read_fact(name) if name else None
    with contextlib.suppress(KeyError, TypeError, ValueError):
        a, b = got["capability"]  # type: ignore[index]
        return int(a), int(b)
    cap = _query_capability()
    if name and cap is not None:  # "no GPU" may be a failed query: asked again
        _write_fact(name, {"capability": cap})
    return cap


def publish_facts(root: Path, backend: str) -> None:
    """Record torch's facts (and on ``cuda`` the GPU's capability) in the cache at ``root``,
    for processes that read it as their trusted cache (an agent's tools: their first command
    then imports no torch and runs no nvidia-smi either)."""
    torch_name, gpu_name = _torch_fact(), _gpu_fact()
    if torch_name:
        _write_fact(torch_name, torch_info(), root)
    cap = device_capability() if backend == "cuda" else None
    if gpu_name and cap is not None and not os.environ.get("CUDA_AGENT_ARCH"):
        _write_fact(gpu_name, {"capability": list(cap)}, root)


def _query_capability() -> tuple[int, int] | None:
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            p = subprocess.run(
                [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            first = p.stdout.strip().splitlines()[0].strip() if p.returncode == 0 else ""
            if first and "." in first:
                a, b = first.split(".")
                return int(a), int(b)
        except (OSError, subprocess.TimeoutExpired, IndexError, ValueError):
            pass
    try:
        p = subprocess.run(
            [sys.executable, "-c", "import torch;print(*torch.cuda.get_device_capability())"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        a, b = p.stdout.split()
        return int(a), int(b)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


def arch_flags(cap: tuple[int, int]) -> list[str]:
    """nvcc -gencode for exactly this device; Hopper gets sm_90a (wgmma, TMA allowed)."""
    a, b = cap
    sm = f"{a}{b}"
    suffix = "a" if (a, b) in ((9, 0), (10, 0), (10, 3)) else ""
    return [f"-gencode=arch=compute_{sm}{suffix},code=sm_{sm}{suffix}"]


def torch_arch_list(cap: tuple[int, int]) -> str:
    """Value for TORCH_CUDA_ARCH_LIST naming only this device."""
    return f"{cap[0]}.{cap[1]}"


@dataclass(frozen=True)
class Flags:
    """Flags of one backend; ``key`` fingerprints them together with tool versions."""

    backend: str
    cxx: str
    nvcc: str | None
    binding_cflags: tuple[str, ...]
    kernel_cflags: tuple[str, ...]
    main_cflags: tuple[str, ...]
    cuda_cflags: tuple[str, ...]
    ldflags: tuple[str, ...]
    include_dirs: tuple[str, ...]
    # torch's libraries (``-l`` names) a module is linked against as symbol-less stand-ins with
    # the real sonames: GNU ld reading libtorch's symbol tables was most of a 0.5-0.7 s link;
    # the loader binds the module to the real libraries (rpath) as before. Empty: off
    # ($CUDA_AGENT_LINK_STUBS=0).
    link_stubs: tuple[str, ...] = ()
    key: str = field(default="")

    @property
    def linker(self) -> str:
        """The linker modules are linked with: ``default`` (the compiler's own) or its name."""
        fuse = [f for f in self.ldflags if f.startswith("-fuse-ld=")]
        return fuse[-1].split("=", 1)[1] if fuse else "default"


@functools.lru_cache(maxsize=4)
def flags_for(backend: str) -> Flags:
    """Compile and link flags for ``backend`` ('cpu' or 'cuda')."""
    ti = torch_info()
    inc = [*ti["include"], python_include()]  # type: ignore[misc]
    cuda_inc = cuda_include_dirs() if backend == "cuda" else []
    defines = [
        "-DTORCH_EXTENSION_NAME=cuda_extension",
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        f"-D_GLIBCXX_USE_CXX11_ABI={ti['cxx11_abi']}",
    ]
    if backend == "cuda":
        defines.append("-DSANDBOX_CUDA=1")
    common = ["-fPIC", "-std=c++20", "-fvisibility=hidden"]
    # binding glue (pybind11 registration, argument checks, launcher calls): -Og compiles about
    # 10% faster than -O1 with the same per-call overhead (-O0 made each call 4x slower); its
    # time is almost all the prelude's template instantiation and code, not the candidate's code.
    # The precompiled prelude is built with exactly these flags (GCC rejects it otherwise).
    binding = ["-Og", *common, *defines] + [f"-I{d}" for d in (*inc, *cuda_inc)]
    # the infrastructure binding.cpp is compiled once per machine, and it is linked first, so the
    # pybind11 code every binding shares (the generic dispatcher, argument loading) comes from
    # its -O1 copy: only each binding's own call wrapper is -Og code
    main = ["-O1", *binding[1:]]
    kernel = ["-O3", "-fPIC", "-std=c++20", *defines] + [f"-I{d}" for d in (*inc, *cuda_inc)]
    cuda: list[str] = []
    nv = nvcc() if backend == "cuda" else None
    if backend == "cuda":
        cap = device_capability() or (9, 0)
        cuda = [
            "-O3",
            "-std=c++17",
            "-Xcompiler",
            "-fPIC",
            "-lineinfo",
            "--expt-relaxed-constexpr",
            "--expt-extended-lambda",
            *arch_flags(cap),
            *[f"-I{d}" for d in ti["include"]],  # type: ignore[union-attr]
        ]
    libdirs = list(ti["lib"])  # type: ignore[call-overload]
    # cuda modules keep the compiler's own linker unless asked (CUDA_AGENT_LINKER=fast or a
    # name): a gold-linked CUDA module has not yet been loaded on a GPU
    ask = os.environ.get("CUDA_AGENT_LINKER")
    linker = fast_linker(cxx()) if backend == "cpu" or ask else None
    ld = ["-shared", *([f"-fuse-ld={linker}"] if linker else [])]
    ld += [f"-L{d}" for d in libdirs] + [f"-Wl,-rpath,{d}" for d in libdirs]
    torch_libs = ["c10", "torch", "torch_cpu", "torch_python"]
    if backend == "cuda":
        torch_libs += ["c10_cuda", "torch_cuda"]
    # every library named stays DT_NEEDED: a link against symbol-less stand-ins of torch's (see
    # build.ensure_link_stubs) cannot tell which ones the module uses (no --push-state: not
    # every linker has it)
    ld += ["-Wl,--no-as-needed", *[f"-l{n}" for n in torch_libs]]
    if backend == "cuda":
        cl = cuda_lib_dirs()
        ld += [f"-L{d}" for d in cl] + [f"-Wl,-rpath,{d}" for d in cl]
        ld += ["-lcudart"]
    stubs = tuple(torch_libs) if os.environ.get("CUDA_AGENT_LINK_STUBS", "1") != "0" else ()
    h = hashlib.sha256()
    for part in (
        backend,
        tool_version(cxx()),
        tool_version(nv) if nv else "",
        str(ti["version"]),
        *binding,
        *main,
        *kernel,
        *cuda,
        *ld,
        *(f"stub:{n}" for n in stubs),
    ):
        h.update(part.encode() + b"\0")
    return Flags(
        backend=backend,
        cxx=cxx(),
        nvcc=nv,
        binding_cflags=tuple(binding),
        kernel_cflags=tuple(kernel),
        main_cflags=tuple(main),
        cuda_cflags=tuple(cuda),
        ldflags=tuple(ld),
        include_dirs=tuple(inc + cuda_inc),
        link_stubs=stubs,
        key=h.hexdigest()[:16],
    )


def default_cache_dir() -> Path:
    """$CUDA_AGENT_SANDBOX_CACHE, else $XDG_CACHE_HOME/cuda-agent/sandbox, else ~/.cache/..."""
    env = os.environ.get("CUDA_AGENT_SANDBOX_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cuda-agent" / "sandbox"
