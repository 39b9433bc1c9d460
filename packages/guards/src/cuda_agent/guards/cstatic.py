"""Static checks on C, C++ and CUDA sources, run on the text AFTER the real preprocessor.

System ``#include`` lines are recorded and removed (their names are checked against the allowed
libraries); the candidate's own headers stay, so ``g++ -E -P`` expands every macro and token paste
the candidate wrote. Each file is preprocessed three times (host, CUDA host pass, CUDA device
pass) and the findings are united, so ``#ifdef __CUDA_ARCH__`` cannot hide a name. When the
preprocessor fails the raw text (comments stripped) is scanned instead and a ``G-OPAQUE-SOURCE``
flag says so.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from .checks import Findings
from .opclass import HALF_DTYPE_NAMES, classify

C_EXTS = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".hh", ".hxx", ".inl")

_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include(?:_next)?[ \t]*([<"])([^>"\n]+)[>"]', re.M)
_COMPUTED_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include(?:_next)?[ \t]*(?![<"])(\S+)', re.M)
_TOKEN_RE = re.compile(
    r'(?P<str>R"(?P<delim>[^(\s]*)\((?:.|\n)*?\)(?P=delim)"|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\')'
    r"|(?P<id>[A-Za-z_]\w*)"
    r"|(?P<num>\d[\w.]*)"
    r"|(?P<op>::|->|<<<|>>>|##|[^\sA-Za-z_\d])"
)
_GLOBAL_RE = re.compile(
    r"__global__\s+(?:(?:__launch_bounds__|__cluster_dims__)\s*\([^)]*\)\s*|static\s+|inline\s+|"
    r"__noinline__\s+|__forceinline__\s+|extern\s+\"C\"\s+)*void\s+"
    r"(?:(?:__launch_bounds__|__cluster_dims__)\s*\([^)]*\)\s*)?(\w+)\s*\("
)
_PYBIND_DEF_RE = re.compile(r'\.\s*def\s*\(\s*"(\w+)"')


@functools.cache
def aten_names() -> frozenset[str]:
    """Base names of ATen operators, shipped with the package (no torch import)."""
    text = resources.files("cuda_agent.guards").joinpath("aten_ops.txt").read_text()
    return frozenset(
        ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")
    )


# --------------------------------------------------------------------------- name tables

_ALLOWED_INCLUDE_PREFIXES = (
    "torch/",
    "ATen/",
    "c10/",
    "pybind11/",
    "cuda/",
    "cub/",
    "crt/",
    "cooperative_groups",
    "cublas",
    "cudnn",
    "cuda_runtime",
    "cuda_fp16",
    "cuda_bf16",
    "cuda_fp8",
    "cuda_fp4",
    "cuda.h",
    "cudaTypedefs",
    "cuda_pipeline",
    "cuda_awbarrier",
    "mma.h",
    "vector_types",
    "vector_functions",
    "device_launch_parameters",
    "device_functions",
    "math_constants",
    "sm_",
    "texture_",
    "surface_",
    "driver_types",
    "builtin_types",
    "host_defines",
    "library_types",
    "omp.h",
    "immintrin.h",
    "x86intrin.h",
    "emmintrin.h",
    "xmmintrin.h",
    "smmintrin.h",
    "pmmintrin.h",
    "tmmintrin.h",
    "avxintrin.h",
    "arm_neon.h",
    "Python.h",
    "nv/",
    "curand_kernel",
    "curand",
)
_REJECT_INCLUDES: dict[str, tuple[str, str]] = {
    "thrust/": ("G-LIBRARY", "Thrust"),
    "cutlass/": ("G-LIBRARY", "CUTLASS"),
    "cute/": ("G-LIBRARY", "CuTe"),
    "cufft": ("G-LIBRARY", "cuFFT"),
    "cusparse": ("G-LIBRARY", "cuSPARSE"),
    "cusolver": ("G-LIBRARY", "cuSOLVER"),
    "cutensor": ("G-LIBRARY", "cuTENSOR"),
    "nccl": ("G-LIBRARY", "NCCL"),
    "nvshmem": ("G-LIBRARY", "NVSHMEM"),
    "magma": ("G-LIBRARY", "MAGMA"),
    "Eigen/": ("G-LIBRARY", "Eigen"),
    "cblas": ("G-LIBRARY", "CBLAS"),
    "mkl": ("G-LIBRARY", "MKL"),
    "dnnl": ("G-LIBRARY", "oneDNN"),
    "flash": ("G-LIBRARY", "flash-attention"),
    "nvrtc": ("G-DYNAMIC-CODE", "NVRTC"),
    "dlfcn.h": ("G-DYNAMIC-CODE", "dlopen"),
    "sys/socket.h": ("G-NETWORK", "sockets"),
    "netinet/": ("G-NETWORK", "sockets"),
    "arpa/": ("G-NETWORK", "sockets"),
    "netdb.h": ("G-NETWORK", "name resolution"),
    "curl/": ("G-NETWORK", "libcurl"),
    "thread": ("G-THREAD", "std::thread"),
    "pthread.h": ("G-THREAD", "pthreads"),
    "future": ("G-THREAD", "std::async"),
    "spawn.h": ("G-THREAD", "posix_spawn"),
    "sys/wait.h": ("G-THREAD", "child processes"),
    "fstream": ("G-FILE-IO", "file streams"),
    "sys/mman.h": ("G-FILE-IO", "mmap"),
    "dirent.h": ("G-FILE-IO", "directory listing"),
    "chrono": ("G-TIMER-PATCH", "host timers"),
    "sys/time.h": ("G-TIMER-PATCH", "host timers"),
    "random": ("G-RNG", "<random>"),
}
# Exact identifiers -> (code, what, severity or None for the policy's)
_IDENTS: dict[str, tuple[str, str, str | None]] = {}


def _add(code: str, what: str, names: Iterable[str], severity: str | None = None) -> None:
    for n in names:
        _IDENTS[n] = (code, what, severity)


_add(
    "G-STREAM",
    "CUDA streams/events",
    [
        "cudaStreamCreate",
        "cudaStreamCreateWithFlags",
        "cudaStreamCreateWithPriority",
        "cudaStreamDestroy",
        "cudaEventCreate",
        "cudaEventCreateWithFlags",
        "cudaEventRecord",
        "cudaEventRecordWithFlags",
        "cudaStreamWaitEvent",
        "cudaEventSynchronize",
        "cudaEventElapsedTime",
        "cudaEventQuery",
        "cudaEventDestroy",
        "cudaStreamPerThread",
        "cudaStreamLegacy",
        "cudaStreamNonBlocking",
        "cudaLaunchHostFunc",
        "cudaStreamAddCallback",
        "cudaStreamAttachMemAsync",
        "cuStreamCreate",
        "cuStreamCreateWithPriority",
        "cuEventCreate",
        "cuEventRecord",
        "cuEventElapsedTime",
        "cuStreamWaitEvent",
        "cuLaunchHostFunc",
        "getStreamFromPool",
        "getStreamFromExternal",
        "setCurrentCUDAStream",
        "CUDAStreamGuard",
        "OptionalCUDAStreamGuard",
        "CUDAMultiStreamGuard",
        "CUDAEvent",
    ],
)
_add(
    "G-GRAPH",
    "CUDA graphs",
    [
        "cudaStreamBeginCapture",
        "cudaStreamEndCapture",
        "cudaGraphCreate",
        "cudaGraphInstantiate",
        "cudaGraphInstantiateWithFlags",
        "cudaGraphLaunch",
        "cudaGraphExecUpdate",
        "cudaGraphAddKernelNode",
        "cudaGraphExec_t",
        "cudaGraph_t",
        "cudaStreamBeginCaptureToGraph",
        "cuGraphLaunch",
        "cuGraphInstantiate",
        "cuStreamBeginCapture",
        "CUDAGraph",
    ],
)
_add(
    "G-THREAD",
    "threads/processes",
    [
        "pthread_create",
        "pthread_detach",
        "fork",
        "vfork",
        "execv",
        "execve",
        "execvp",
        "execl",
        "execlp",
        "system",
        "popen",
        "posix_spawn",
        "posix_spawnp",
        "jthread",
        "async_task",
        "omp_set_nested",
    ],
)
_add(
    "G-L2-PERSIST",
    "persisting L2",
    [
        "cudaStreamSetAttribute",
        "cuStreamSetAttribute",
        "cudaStreamAttrValue",
        "cudaStreamAttributeAccessPolicyWindow",
        "accessPolicyWindow",
        "cudaAccessPropertyPersisting",
        "cudaLimitPersistingL2CacheSize",
        "cudaCtxResetPersistingL2Cache",
        "cudaKernelNodeAttributeAccessPolicyWindow",
        "cudaLaunchAttributeAccessPolicyWindow",
        "CU_LIMIT_PERSISTING_L2_CACHE_SIZE",
        "CU_ACCESS_PROPERTY_PERSISTING",
        "cudaAccessPolicyWindow",
        "hitRatio",
        "hitProp",
    ],
)
_add(
    "G-DYNAMIC-CODE",
    "dynamic code loading",
    [
        "dlopen",
        "dlsym",
        "dlmopen",
        "RTLD_NEXT",
        "RTLD_DEFAULT",
        "RTLD_GLOBAL",
        "RTLD_LAZY",
        "RTLD_NOW",
        "nvrtcCreateProgram",
        "nvrtcCompileProgram",
        "cuModuleLoad",
        "cuModuleLoadData",
        "cuModuleLoadDataEx",
        "cuModuleLoadFatBinary",
        "cuModuleGetFunction",
        "cuLibraryLoadData",
        "cuLibraryLoadFromFile",
        "cudaLibraryLoadData",
        "cudaLibraryLoadFromFile",
        "cuLinkCreate",
        "cuLinkAddData",
        "PyRun_SimpleString",
        "PyRun_String",
        "PyImport_ImportModule",
        "PyImport_Import",
        "PyEval_EvalCode",
        "PyObject_SetAttr",
        "PyObject_SetAttrString",
        "Py_CompileString",
    ],
)
_add(
    "G-FILE-IO",
    "file access",
    [
        "fopen",
        "fopen64",
        "freopen",
        "fdopen",
        "fwrite",
        "fread",
        "fputs",
        "fgets",
        "fprintf_file",
        "ifstream",
        "ofstream",
        "fstream",
        "filebuf",
        "mmap",
        "munmap",
        "unlink",
        "remove_file",
        "rename",
        "opendir",
        "readdir",
        "readlink",
        "symlink",
        "truncate",
        "ftruncate",
        "creat",
    ],
)
_add(
    "G-NETWORK",
    "network access",
    [
        "socket",
        "getaddrinfo",
        "gethostbyname",
        "inet_pton",
        "inet_addr",
        "sockaddr",
        "sockaddr_in",
        "curl_easy_init",
        "curl_easy_perform",
    ],
)
_add(
    "G-ENV",
    "environment access",
    ["getenv", "setenv", "putenv", "unsetenv", "secure_getenv", "environ"],
)
_add(
    "G-TIMER-PATCH",
    "host timers",
    [
        "clock_gettime",
        "gettimeofday",
        "rdtsc",
        "__rdtsc",
        "steady_clock",
        "high_resolution_clock",
        "system_clock",
    ],
    "flag",
)
_add(
    "G-RNG",
    "random numbers",
    [
        "curand_init",
        "curand",
        "curand_uniform",
        "curand_normal",
        "srand",
        "rand",
        "rand_r",
        "drand48",
        "random_device",
        "mt19937",
        "mt19937_64",
        "default_random_engine",
        "curandCreateGenerator",
        "curandGenerateUniform",
        "curandGenerateNormal",
    ],
)
_add(
    "G-LIBRARY",
    "third-party library",
    [
        "cufftPlan1d",
        "cufftPlan2d",
        "cufftPlanMany",
        "cufftExecC2C",
        "cufftExecR2C",
        "cusparseCreate",
        "cusolverDnCreate",
        "cutensorCreate",
        "ncclCommInitRank",
        "ncclAllReduce",
        "cblas_sgemm",
        "cblas_dgemm",
    ],
)
_add(
    "G-STATE",
    "raw device allocation",
    [
        "cudaMalloc",
        "cudaMallocManaged",
        "cudaMallocAsync",
        "cudaMallocHost",
        "cudaHostAlloc",
        "cudaMallocPitch",
        "cuMemAlloc",
        "raw_alloc",
    ],
    "flag",
)
_add(
    "G-HARNESS-PATCH",
    "Python objects modified from C++",
    ["setattr", "delattr", "PyObject_GenericSetAttr", "PyDict_SetItemString"],
)
_add(
    "G-INTROSPECTION",
    "Python frames from C++",
    [
        "PyEval_GetFrame",
        "PyThreadState_Get",
        "PyEval_SetProfile",
        "PyEval_SetTrace",
        "PyFrame_GetBack",
        "_PyThreadState_GET",
    ],
)

_LIB_NAMESPACES = {
    "thrust": "Thrust",
    "cutlass": "CUTLASS",
    "cute": "CuTe",
    "Eigen": "Eigen",
    "tbb": "TBB",
    "flash": "flash-attention",
}
_STREAM_ASYNC_NS = {("std", "thread"), ("std", "jthread"), ("std", "async"), ("std", "launch")}

_PRECISION_STRONG = frozenset(
    [
        "__float2half",
        "__float2half_rn",
        "__float2half_rz",
        "__float2half_rd",
        "__float2half_ru",
        "__half2float",
        "__float2bfloat16",
        "__float2bfloat16_rn",
        "__float2bfloat16_rz",
        "__bfloat162float",
        "__float22half2_rn",
        "__half22float2",
        "__float22bfloat162_rn",
        "__bfloat1622float2",
        "__floats2half2_rn",
        "__floats2bfloat162_rn",
        "__hmul",
        "__hadd",
        "__hsub",
        "__hdiv",
        "__hfma",
        "__hmul2",
        "__hadd2",
        "__hfma2",
        "__hmax",
        "__hmin",
        "hexp",
        "hlog",
        "hsqrt",
        "h2exp",
        "__float_to_tf32",
        "float_to_tf32",
        "CUBLAS_COMPUTE_32F_FAST_16F",
        "CUBLAS_COMPUTE_32F_FAST_16BF",
        "CUBLAS_COMPUTE_32F_FAST_TF32",
        "CUBLAS_TF32_TENSOR_OP_MATH",
        "CUBLAS_COMPUTE_16F",
        "CUDA_R_16F",
        "CUDA_R_16BF",
        "CUDA_R_8F_E4M3",
        "CUDA_R_8F_E5M2",
        "CUDNN_DATA_HALF",
        "CUDNN_DATA_BFLOAT16",
        "CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION",
        "CUBLAS_TENSOR_OP_MATH",
        "kHalf",
        "kBFloat16",
        "kFloat16",
        "kFloat8_e4m3fn",
        "kFloat8_e5m2",
        "__nv_cvt_float_to_fp8",
    ]
)
_PRECISION_WEAK = frozenset(
    [
        "__half",
        "half",
        "__half2",
        "half2",
        "__nv_bfloat16",
        "__nv_bfloat162",
        "nv_bfloat16",
        "nv_bfloat162",
        "Half",
        "BFloat16",
        "__nv_fp8_e4m3",
        "__nv_fp8_e5m2",
        "tf32",
        "precision",
    ]
)
_PTX_LOWP_RE = re.compile(r"\b(w?gmma|mma|wmma)\b[^\"]*\.(f16|bf16|tf32|e4m3|e5m2)\b")
_PTX_L2_RE = re.compile(r"createpolicy|L2::evict_last|evict_last|L2::cache_hint|applypriority")
_PTX_TIMER_RE = re.compile(r"%globaltimer|%clock64|%clock\b")

# Method names that are ATen ops but also common C++ methods.
_METHOD_EXCLUDE = frozenset(
    [
        "any",
        "all",
        "sync",
        "fill",
        "resize",
        "swap",
        "data",
        "size",
        "numel",
        "item",
        "copy",
        "to",
        "type",
        "record",
        "wait",
        "clear",
        "empty",
        "insert",
        "count",
        "find",
        "at",
        "begin",
        "end",
        "get",
        "set",
        "load",
        "store",
        "reset",
        "release",
        "add",
        "sub",
        "min",
        "max",
        "abs",
    ]
)
_TORCH_ROOTS = ("torch", "at", "c10", "caffe2")
_TORCH_OK_NAMES = frozenset(
    [
        "Tensor",
        "TensorOptions",
        "ScalarType",
        "Scalar",
        "Device",
        "DeviceType",
        "Layout",
        "MemoryFormat",
        "IntArrayRef",
        "ArrayRef",
        "OptionalIntArrayRef",
        "optional",
        "nullopt",
        "TensorList",
        "kCUDA",
        "kCPU",
        "kFloat",
        "kFloat32",
        "kDouble",
        "kFloat64",
        "kInt",
        "kInt32",
        "kLong",
        "kInt64",
        "kShort",
        "kByte",
        "kChar",
        "kBool",
        "kStrided",
        "Half",
        "BFloat16",
        "cuda",
        "getCurrentCUDAStream",
        "getDefaultCUDAStream",
        "CUDAGuard",
        "OptionalCUDAGuard",
        "DeviceGuard",
        "OptionalDeviceGuard",
        "getCurrentCUDABlasHandle",
        "getCurrentCUDABlasLtHandle",
        "getCurrentCUDNNHandle",
        "getCurrentDeviceProperties",
        "getDeviceProperties",
        "current_device",
        "device_count",
        "CUDAStream",
        "stream",
        "Stream",
        "AutoDispatchBelowADInplaceOrView",
        "InferenceMode",
        "NoGradGuard",
        "autograd",
        "Dispatcher",
        "irange",
        "elementSizeInBytes",
        "toString",
        "str",
        "indexing",
        "Slice",
        "None",
        "Ellipsis",
        "TORCH_CHECK",
        "TORCH_INTERNAL_ASSERT",
        "TORCH_LIBRARY",
        "TORCH_LIBRARY_IMPL",
        "ivalue",
        "IValue",
        "List",
        "Dict",
        "detail",
        "util",
        "utils",
        "blas",
        "python",
        "pybind",
        "nn",
        "functional",
        "accumulate_type",
        "acc_type",
        "exception",
        "Error",
        "ValueError",
        "TypeError",
        "IndexError",
        "NotImplementedError",
        "OptionalArrayRef",
        "SymInt",
        "SymIntArrayRef",
        "numeric_limits",
        "complex",
        "qint8",
        "quint8",
        "kComplexFloat",
        "DispatchKey",
        "DispatchKeySet",
        "native",
        "ops",
        "_ops",
        "cpu",
        "Storage",
        "DataPtr",
        "Allocator",
        "GetAllocator",
        "getCUDADeviceAllocator",
        "dtype",
        "kHalf",
        "kBFloat16",
        "kFloat16",
        "ScalarTypeToCPPType",
        "CppTypeToScalarType",
        "toUnderlying",
    ]
)


@dataclass
class CSource:
    """One C/C++/CUDA text to scan, with a display name (file path or ``load_inline:<arg>``)."""

    name: str
    text: str


@dataclass
class CScanResult:
    kernels: list[str] = field(default_factory=list)  # __global__ function names
    functions: list[str] = field(default_factory=list)  # pybind-exported names
    has_code: bool = False
    preprocessed: bool = True


def _strip_comments(text: str) -> str:
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "/":
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif c == "/" and i + 1 < n and text[i + 1] == "*":
            j = text.find("*/", i + 2)
            out.append(" ")
            i = n if j < 0 else j + 2
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _local_name(inc: str, local: dict[str, str]) -> str | None:
    """The candidate file an ``#include "..."`` names, by relative path or basename."""
    norm = os.path.normpath(inc).lstrip("./")
    if norm in local:
        return norm
    base = os.path.basename(inc)
    for k in local:
        if os.path.basename(k) == base:
            return k
    return None


def _prepare(text: str, local: dict[str, str], fs: Findings, where: str) -> str:
    """Record and remove system and unknown includes; keep the candidate's own headers."""

    def repl(m: re.Match[str]) -> str:
        kind, inc = m.group(1), m.group(2).strip()
        if kind == '"' and _local_name(inc, local) is not None:
            return f'#include "{_local_name(inc, local)}"'
        _check_include(inc, fs, where)
        return ""

    text = _INCLUDE_RE.sub(repl, text)

    def computed(m: re.Match[str]) -> str:
        fs.add("G-OPAQUE-SOURCE", f"{where}: computed #include {m.group(1)}", m.group(0))
        return ""

    return _COMPUTED_INCLUDE_RE.sub(computed, text)


def _check_include(inc: str, fs: Findings, where: str) -> None:
    if inc.startswith("/"):
        fs.add("G-FILE-IO", f"{where}: #include of an absolute path", inc)
        return
    for prefix, (code, what) in _REJECT_INCLUDES.items():
        exact = not (prefix.endswith("/") or prefix.endswith(".h")) and prefix in _EXACT_INCLUDES
        if (inc == prefix) if exact else inc.startswith(prefix):
            sev = "flag" if code == "G-TIMER-PATCH" else None
            fs.add(code, f"{where}: #include <{inc}> ({what})", inc, severity=sev)
            return


_EXACT_INCLUDES = frozenset({"thread", "future", "fstream", "chrono", "random"})


def preprocess(texts: dict[str, str], config: str, timeout: float = 20.0) -> dict[str, str] | None:
    """Run ``g++ -E -P`` on every prepared text under ``config`` (``host``, ``cuda-host``,
    ``cuda-device``); ``None`` when the preprocessor is missing or fails."""
    cxx = shutil.which("g++") or shutil.which("cpp") or shutil.which("clang++")
    if cxx is None:
        return None
    defines = {
        "host": [],
        "cuda-host": ["-D__CUDACC__", "-D__NVCC__", "-D__CUDACC_VER_MAJOR__=12"],
        "cuda-device": [
            "-D__CUDACC__",
            "-D__NVCC__",
            "-D__CUDA_ARCH__=900",
            "-D__CUDACC_VER_MAJOR__=12",
        ],
    }[config]
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="guards-pp-") as d:
        for rel, text in texts.items():
            p = Path(d, rel)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        for rel in texts:
            try:
                r = subprocess.run(
                    [
                        cxx,
                        "-E",
                        "-P",
                        "-x",
                        "c++",
                        "-nostdinc",
                        "-std=c++17",
                        "-w",
                        *defines,
                        "-I",
                        d,
                        "-I",
                        str(Path(d, rel).parent),
                        str(Path(d, rel)),
                    ],
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                    cwd=d,
                )
            except (OSError, subprocess.TimeoutExpired):
                return None
            if r.returncode != 0:
                return None
            out[rel] = r.stdout
    return out


def _tokens(text: str) -> list[tuple[str, str, int]]:
    """(kind, value, offset) tokens: str, id, num, op."""
    toks = []
    for m in _TOKEN_RE.finditer(text):
        kind = m.lastgroup if m.lastgroup != "delim" else "str"
        if m.group("str") is not None:
            kind = "str"
        toks.append((kind, m.group(0), m.start()))
    return toks


def _line_at(text: str, off: int) -> str:
    a = text.rfind("\n", 0, off) + 1
    b = text.find("\n", off)
    return text[a : (len(text) if b < 0 else b)].strip()[:300]


def _user_defined(text: str) -> set[str]:
    """Names the candidate defines itself (functions, methods, structs), to avoid clashes."""
    names = set(re.findall(r"\b(?:struct|class|union|enum)\s+(\w+)", text))
    names |= set(
        re.findall(r"[\w>*&]\s+(\w+)\s*\([^;{}]*\)\s*(?:const\s*)?(?:noexcept\s*)?\{", text)
    )
    return names


def scan_text(text: str, where: str, fs: Findings, float32_task: bool, result: CScanResult) -> None:
    """Scan one preprocessed (or comment-stripped) text for every C-side rule."""
    toks = _tokens(text)
    own = _user_defined(text)
    aliases: dict[str, str] = {}
    for m in re.finditer(r"\bnamespace\s+(\w+)\s*=\s*(?:::)?(\w+)", text):
        if m.group(2) in _TORCH_ROOTS or m.group(2) in _LIB_NAMESPACES:
            aliases[m.group(1)] = m.group(2)
    for m in re.finditer(r"\busing\s+namespace\s+(?:::)?(\w+)((?:::\w+)*)\s*;", text):
        root = m.group(1)
        if root in _TORCH_ROOTS and "native" in m.group(2):
            fs.add("G-TORCH-COMPUTE", f"{where}: using namespace {root}{m.group(2)}", m.group(0))
        elif root in _TORCH_ROOTS:
            fs.add(
                "G-TORCH-COMPUTE",
                f"{where}: 'using namespace {root}' hides qualified torch calls",
                m.group(0),
                severity="flag",
            )
        elif root in _LIB_NAMESPACES:
            fs.add(
                "G-LIBRARY",
                f"{where}: using namespace {root} ({_LIB_NAMESPACES[root]})",
                m.group(0),
            )
    for m in re.finditer(r"\busing\s+(?:::)?(torch|at)((?:::\w+)+)\s*;", text):
        name = m.group(2).split("::")[-1]
        if name in aten_names() and classify(name) == "compute":
            fs.add("G-TORCH-COMPUTE", f"{where}: using {m.group(1)}{m.group(2)}", m.group(0))
    if "try" in text and re.search(r"\btry\s*\{", text) and re.search(r"\bcatch\s*\(", text):
        m = re.search(r"\bcatch\s*\(", text)
        fs.add(
            "G-FALLBACK",
            f"{where}: try/catch in C++ (a fallback path?)",
            _line_at(text, m.start() if m else 0),
            severity="flag",
        )
    for m in re.finditer(
        r"\bstatic\s+(?:const\s+|thread_local\s+|inline\s+)*(?:(?:torch|at)::Tensor|"
        r"std::(?:unordered_)?map\s*<[^;()]*?>|std::vector\s*<\s*(?:torch|at)::Tensor\s*>|"
        r"[\w:]+\s*\*+)\s*(\w+)\s*(?:=|;|\[|\{)",
        text,
    ):
        fs.add(
            "G-STATE",
            f"{where}: static state that persists across calls",
            _line_at(text, m.start()),
        )
    for m in re.finditer(
        r"^\s*#\s*pragma\s+omp\s+(task|taskloop|single\s+nowait|parallel\s+.*nowait)", text, re.M
    ):
        fs.add(
            "G-THREAD",
            f"{where}: OpenMP {m.group(1)} (work may outlive the call)",
            m.group(0).strip(),
            severity="flag",
        )
    # interposition: candidate defines a function with a CUDA/driver/libc API name
    for m in re.finditer(
        r"(?:^|[;}\s])(?:extern\s+\"C\"\s+)?[\w*&\s]+?\b("
        r"(?:cuda|cu)(?:Event|Stream|Device|Ctx|Launch|Memcpy|Memset|Malloc|Free|Graph|GetLastError|"
        r"PeekAtLastError|Func|Occupancy)\w*|cublas[A-Z]\w*|cudnn[A-Z]\w*|"
        r"clock_gettime|gettimeofday)\s*\([^;{}()]*\)\s*\{",
        text,
    ):
        name = m.group(1)
        timing = any(s in name for s in ("Event", "Elapsed", "Synchronize", "clock", "time"))
        fs.add(
            "G-TIMER-PATCH" if timing else "G-HARNESS-PATCH",
            f"{where}: defines {name}, a CUDA/system API name (symbol interposition)",
            _line_at(text, m.start(1)),
        )
    result.kernels += [k for k in _GLOBAL_RE.findall(text) if k not in result.kernels]
    result.functions += [f for f in _PYBIND_DEF_RE.findall(text) if f not in result.functions]
    if re.search(r"[;{}]", text):
        result.has_code = True

    n = len(toks)
    i = 0
    while i < n:
        kind, val, off = toks[i]
        if kind == "str":
            body = val
            if _PTX_LOWP_RE.search(body) and float32_task:
                fs.add(
                    "G-PRECISION",
                    f"{where}: low-precision tensor-core PTX on a float32 task",
                    _line_at(text, off),
                )
            if _PTX_L2_RE.search(body):
                fs.add(
                    "G-L2-PERSIST",
                    f"{where}: L2 eviction-priority / cache-policy PTX",
                    _line_at(text, off),
                    severity="flag",
                )
            if _PTX_TIMER_RE.search(body):
                fs.add(
                    "G-TIMER-PATCH",
                    f"{where}: reads a GPU timer register",
                    _line_at(text, off),
                    severity="flag",
                )
            if re.search(r"/proc/|/dev/|/etc/|/tmp/|\.\./|model\.py|utils/", body):
                fs.add(
                    "G-FILE-IO", f"{where}: string names a path outside the solution", body[:200]
                )
            if re.search(r"lib\w+\.so", body):
                fs.add("G-DYNAMIC-CODE", f"{where}: string names a shared library", body[:200])
            i += 1
            continue
        if kind != "id":
            i += 1
            continue
        # qualified name starting here
        parts = [val]
        j = i + 1
        while j + 1 < n and toks[j][1] == "::" and toks[j + 1][0] == "id":
            parts.append(toks[j + 1][1])
            j += 2
        prev = toks[i - 1][1] if i > 0 else ""
        if prev == "::" and i >= 2 and toks[i - 2][0] == "id":
            i = j  # inside a qualified name already handled
            continue
        nxt = toks[j][1] if j < n else ""
        is_call = nxt in ("(", "<", "{")
        root = aliases.get(parts[0], parts[0])
        last = parts[-1]
        line = _line_at(text, off)
        if len(parts) > 1 and root in _TORCH_ROOTS:
            _torch_qualified(root, parts, is_call, fs, where, line, float32_task)
        elif len(parts) > 1 and root in _LIB_NAMESPACES:
            fs.add("G-LIBRARY", f"{where}: {'::'.join(parts)} ({_LIB_NAMESPACES[root]})", line)
        elif len(parts) > 1 and root == "cub" and last.startswith("Device"):
            fs.add("G-LIBRARY", f"{where}: {'::'.join(parts)} (CUB device-wide algorithm)", line)
        elif len(parts) > 1 and (root, parts[1]) in _STREAM_ASYNC_NS:
            fs.add("G-THREAD", f"{where}: {'::'.join(parts)}", line)
        elif (
            len(parts) > 1
            and parts[0] in ("py", "pybind11")
            and last
            in (
                "import",
                "exec",
                "eval",
                "eval_file",
                "module_",
            )
            and (last != "module_" or nxt == "::")
        ):
            if last in ("import", "exec", "eval", "eval_file"):
                fs.add("G-DYNAMIC-CODE", f"{where}: Python {last} from C++", line)
        elif len(parts) > 1 and parts[0] == "std" and last in ("ifstream", "ofstream", "fstream"):
            fs.add("G-FILE-IO", f"{where}: std::{last}", line)
        for p in parts:
            hit = _IDENTS.get(p)
            if hit is not None and not (p in own and p not in ("cudaStreamPerThread",)):
                code, what, sev = hit
                if (
                    p in ("rand", "system", "socket", "truncate", "remove_file", "rename", "creat")
                    and not is_call
                ):
                    continue
                if code == "G-RNG" and not float32_task and p == "rand":
                    pass
                fs.add(code, f"{where}: {p} ({what})", line, severity=sev)  # type: ignore[arg-type]
            if float32_task and p in _PRECISION_STRONG:
                fs.add("G-PRECISION", f"{where}: {p} on a float32 task", line)
            elif float32_task and p in _PRECISION_WEAK and p not in own:
                fs.add(
                    "G-PRECISION",
                    f"{where}: low-precision type {p} on a float32 task (not proof of use)",
                    line,
                    severity="flag",
                )
            if (
                p.startswith("cufft")
                or p.startswith("cusparse")
                or p.startswith("cusolver")
                or p.startswith("nccl")
            ):
                fs.add("G-LIBRARY", f"{where}: {p}", line)
        # tensor method call: .name( or ->name(
        if len(parts) == 1 and prev in (".", "->") and nxt == "(" and last not in own:
            if last in ("half", "bfloat16") and float32_task:
                fs.add("G-PRECISION", f"{where}: .{last}() on a float32 task", line)
            elif (
                last in aten_names()
                and classify(last) in ("compute", "random")
                and last not in _METHOD_EXCLUDE
            ):
                code = "G-RNG" if classify(last) == "random" else "G-TORCH-COMPUTE"
                fs.add(code, f"{where}: tensor method .{last}()", line)
        i = j


def _torch_qualified(
    root: str, parts: list[str], is_call: bool, fs: Findings, where: str, line: str, f32: bool
) -> None:
    qual = "::".join(parts)
    last = parts[-1]
    inner = set(parts[1:-1])
    if last in _TORCH_OK_NAMES or last.startswith(("getCurrent", "getCudnn", "getCublas")):
        return
    if inner & {
        "native",
        "_ops",
        "cpu",
        "compositeexplicitautograd",
        "compositeimplicitautograd",
    } and (last in aten_names() or "_ops" in inner or "native" in inner):
        if classify(last) not in ("alloc", "view"):
            fs.add(
                "G-TORCH-COMPUTE",
                f"{where}: {qual} calls an ATen kernel directly (bypasses dispatch)",
                line,
            )
        return
    if "cuda" in inner and last in aten_names() and classify(last) == "compute" and is_call:
        fs.add(
            "G-TORCH-COMPUTE",
            f"{where}: {qual} calls an ATen kernel directly (bypasses dispatch)",
            line,
        )
        return
    if last in HALF_DTYPE_NAMES or last in ("kHalf", "kBFloat16", "kFloat16"):
        if f32:
            fs.add("G-PRECISION", f"{where}: {qual} on a float32 task", line)
        return
    if last in _IDENTS:
        return  # reported by the identifier table (streams, events, ...)
    if last in _TORCH_OK_NAMES or not is_call:
        return
    if last in aten_names():
        cls = classify(last)
        if cls == "compute":
            fs.add("G-TORCH-COMPUTE", f"{where}: {qual}", line)
        elif cls == "random":
            fs.add("G-RNG", f"{where}: {qual}", line)
        return
    if "functional" in inner or "nn" in inner:
        fs.add("G-TORCH-COMPUTE", f"{where}: {qual}", line)


def scan_sources(sources: list[CSource], fs: Findings, float32_task: bool = True) -> CScanResult:
    """Preprocess and scan ``sources`` together (so their own headers resolve); return the
    kernels and bound functions found."""
    result = CScanResult()
    if not sources:
        return result
    local = {s.name: s.text for s in sources}
    prepared: dict[str, str] = {}
    safe_names: dict[str, str] = {}
    for k, s in enumerate(sources):
        rel = (
            os.path.normpath(s.name).lstrip("./")
            if not s.name.startswith("<")
            else f"inline_{k}.cu"
        )
        if rel.startswith("load_inline") or ":" in rel:
            rel = f"inline_{k}.cu"
        safe_names[rel] = s.name
        prepared[rel] = _prepare(s.text, local, fs, s.name)
    outputs: list[dict[str, str]] = []
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=3) as pool:  # three compiler processes at once
        results = list(
            pool.map(lambda c: preprocess(prepared, c), ("host", "cuda-host", "cuda-device"))
        )
    outputs = [] if any(pp is None for pp in results) else [pp for pp in results if pp is not None]
    if not outputs:
        result.preprocessed = False
        fs.add(
            "G-OPAQUE-SOURCE",
            "the C/C++ preprocessor failed; raw text scanned instead",
            ", ".join(s.name for s in sources),
        )
        outputs = [{rel: _strip_comments(t) for rel, t in prepared.items()}]
    for pp in outputs:
        for rel, text in pp.items():
            scan_text(text, safe_names.get(rel, rel), fs, float32_task, result)
    return result
