"""The seed operator catalogue: how to turn each torch operator into a legal program stage.

A :class:`Seed` names one operator (``op`` is its qualified name in the installed torch, checked
by the crawl), its category, the input ranks it accepts and a ``build`` function that appends
the operator to a :class:`~cuda_agent.opsynth.builder.Builder` with arguments that are legal for
the builder's current shape (channel counts, divisibility, dims). ``build`` raises
:class:`~cuda_agent.opsynth.builder.NotApplicable` when the shape does not allow the operator.

Seeds come from ``torch`` (``nn`` modules, ``torch`` and ``torch.nn.functional`` functions) and
from ``transformers``-style activations and norms written in plain PyTorch (``origin`` tells).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .builder import Builder, Dim, NotApplicable, snake

CATEGORIES = (
    "gemm",
    "conv",
    "attention",
    "activation",
    "elementwise",
    "norm",
    "pooling",
    "resample",
    "reduction",
    "scan",
    "indexing",
    "loss",
    "distance",
    "recurrent",
)
HEAVY = ("gemm", "conv", "attention", "recurrent")


@dataclass(frozen=True)
class Seed:
    """One seed operator; see the module docstring."""

    name: str  # KernelBench-style name part, e.g. "Conv2d", "GELU"
    op: str  # qualified torch name, e.g. "nn.Conv2d", "F.gelu", "torch.cumsum"
    category: str
    build: Callable[[Builder], dict[int, str] | None]
    ranks: tuple[int, ...] | None = None  # accepted input ranks; None: any rank >= 2
    family: str | None = None  # input family when first (None: any family of an accepted rank)
    terminal: bool = False  # output cannot be followed (losses, full reductions)
    first_only: bool = False  # needs a special input (token ids)
    origin: str = "torch"  # "torch" or "transformers" (written in plain PyTorch)
    stochastic_hint: bool = False  # expected to consume RNG (the crawl probes it anyway)
    not_last: bool = False  # a degenerate (saturated / binary) output when it ends a chain

    @property
    def heavy(self) -> bool:
        return self.category in HEAVY


SEEDS: dict[str, Seed] = {}


def seed(name: str, op: str, category: str, **kw) -> Callable:
    """Register the decorated build function as a seed."""
    assert category in CATEGORIES, category

    def deco(fn: Callable[[Builder], dict[int, str] | None]) -> Callable:
        assert name not in SEEDS, name
        SEEDS[name] = Seed(name=name, op=op, category=category, build=fn, **kw)
        return fn

    return deco


def simple(name: str, op: str, category: str, expr: str, **kw) -> None:
    """A shape-preserving seed: ``x = <expr>`` (``expr`` uses ``x``)."""

    def build(b: Builder) -> None:
        b.emit(f"x = {expr}")

    seed(name, op, category, **kw)(build)


def module(name: str, op: str, category: str, ctor: str, call: str = "x = self.{a}(x)", **kw):
    """A seed that is an ``nn`` module built without shape arguments (``ctor``)."""

    def build(b: Builder) -> None:
        a = b.attr(snake(name), ctor)
        b.emit(call.format(a=a))

    seed(name, op, category, **kw)(build)


def _last_dim_name(b: Builder, base: str) -> str:
    d = b.shape[-1]
    return d.name if d.name else b.const(base, d.value)


def _chan_name(b: Builder, base: str = "channels") -> str:
    d = b.shape[1]
    return d.name if d.name else b.const(base, d.value)


def _dim_of_size(b: Builder, dims: list[int], n: int = 2) -> int:
    """One of ``dims`` whose size is >= n (softmax over a size-1 dim is constant)."""
    ok = [d for d in dims if b.shape[d].value >= n]
    if not ok:
        raise NotApplicable(f"no dim of size >= {n} among {dims}")
    return b.choice(ok)


def _divisors(n: int, choices: list[int]) -> list[int]:
    return [c for c in choices if n % c == 0]


# ============================================================================ activations (torch)
simple("ReLU", "torch.relu", "activation", "torch.relu(x)")
module("ReLU6", "nn.ReLU6", "activation", "nn.ReLU6()")
simple("GELU", "F.gelu", "activation", "F.gelu(x)")
simple("SiLU", "F.silu", "activation", "F.silu(x)")
simple("Mish", "F.mish", "activation", "F.mish(x)")
simple("Sigmoid", "torch.sigmoid", "activation", "torch.sigmoid(x)")
simple("Tanh", "torch.tanh", "activation", "torch.tanh(x)")
simple("SELU", "torch.selu", "activation", "torch.selu(x)")
simple("Softsign", "F.softsign", "activation", "F.softsign(x)")
simple("Hardsigmoid", "F.hardsigmoid", "activation", "F.hardsigmoid(x)")
simple("Hardswish", "F.hardswish", "activation", "F.hardswish(x)")
simple("Tanhshrink", "F.tanhshrink", "activation", "F.tanhshrink(x)")
simple("LogSigmoid", "F.logsigmoid", "activation", "F.logsigmoid(x)")
module("Softplus", "nn.Softplus", "activation", "nn.Softplus(beta=1.0, threshold=20.0)")
module("Hardshrink", "nn.Hardshrink", "activation", "nn.Hardshrink(lambd=0.5)")
module("Softshrink", "nn.Softshrink", "activation", "nn.Softshrink(lambd=0.5)")
module("PReLU", "nn.PReLU", "activation", "nn.PReLU()")
module(
    "RReLU", "nn.RReLU", "activation", "nn.RReLU(lower=0.125, upper=0.333)", stochastic_hint=True
)
module("Dropout", "nn.Dropout", "activation", "nn.Dropout(p=0.1)", stochastic_hint=True)
module(
    "AlphaDropout", "nn.AlphaDropout", "activation", "nn.AlphaDropout(p=0.1)", stochastic_hint=True
)
module(
    "Dropout2d",
    "nn.Dropout2d",
    "activation",
    "nn.Dropout2d(p=0.1)",
    ranks=(4,),
    stochastic_hint=True,
)
simple(
    "GaussianNoise",
    "torch.randn_like",
    "elementwise",
    "x + 0.01 * torch.randn_like(x)",
    stochastic_hint=True,
)


@seed("LeakyReLU", "F.leaky_relu", "activation")
def _leaky(b: Builder) -> None:
    slope = b.choice([0.01, 0.05, 0.1, 0.2])
    b.emit(f"x = F.leaky_relu(x, negative_slope={slope})")


@seed("ELU", "nn.ELU", "activation")
def _elu(b: Builder) -> None:
    a = b.attr("elu", f"nn.ELU(alpha={b.choice([0.5, 1.0])})")
    b.emit(f"x = self.{a}(x)")


@seed("CELU", "F.celu", "activation")
def _celu(b: Builder) -> None:
    b.emit(f"x = F.celu(x, alpha={b.choice([0.5, 1.0, 2.0])})")


@seed("Hardtanh", "F.hardtanh", "activation")
def _hardtanh(b: Builder) -> None:
    lo = b.choice([-1.0, -2.0, -0.5])
    b.emit(f"x = F.hardtanh(x, min_val={lo}, max_val={-lo})")


@seed("Threshold", "F.threshold", "activation")
def _threshold(b: Builder) -> None:
    b.emit(f"x = F.threshold(x, {b.choice([0.1, 0.5])}, 0.0)")


@seed("GLU", "F.glu", "activation")
def _glu(b: Builder) -> dict[int, str] | None:
    if b.shape[-1].value % 2 or b.shape[-1].value < 4:
        raise NotApplicable("GLU needs an even last dim")
    b.emit("x = F.glu(x, dim=-1)")
    return None


@seed("Softmax", "torch.softmax", "activation")
def _softmax(b: Builder) -> None:
    dim = _dim_of_size(b, [1, -1])
    b.emit(f"x = torch.softmax(x, dim={dim})")


@seed("LogSoftmax", "F.log_softmax", "activation")
def _log_softmax(b: Builder) -> None:
    b.emit(f"x = F.log_softmax(x, dim={_dim_of_size(b, [1, -1])})")


@seed("Softmin", "F.softmin", "activation")
def _softmin(b: Builder) -> None:
    b.emit(f"x = F.softmin(x, dim={_dim_of_size(b, [-1])})")


# ============================================================================ transformers-style
# Pure-PyTorch formulations of transformers.activations / normalisation layers (no dependency).
T = {"origin": "transformers"}
simple(
    "NewGELU",
    "transformers.activations.NewGELUActivation",
    "activation",
    "0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))",
    **T,
)
simple(
    "FastGELU",
    "transformers.activations.FastGELUActivation",
    "activation",
    "0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))",
    **T,
)
simple(
    "QuickGELU",
    "transformers.activations.QuickGELUActivation",
    "activation",
    "x * torch.sigmoid(1.702 * x)",
    **T,
)
simple(
    "ClippedGELU",
    "transformers.activations.ClippedGELUActivation",
    "activation",
    "torch.clip(F.gelu(x), -10.0, 10.0)",
    **T,
)
simple(
    "GELUTanh",
    "transformers.activations.PytorchGELUTanh",
    "activation",
    'F.gelu(x, approximate="tanh")',
    **T,
)
simple(
    "ReLUSquared",
    "transformers.activations.ReLUSquaredActivation",
    "activation",
    "torch.square(torch.relu(x))",
    **T,
)
simple(
    "LaplaceActivation",
    "transformers.activations.LaplaceActivation",
    "activation",
    "0.5 * (1.0 + torch.erf((x - 0.707107) / (0.282095 * 1.4142135623730951)))",
    **T,
)


@seed("SwiGLU", "transformers.models.llama.LlamaMLP", "activation", **T)
def _swiglu(b: Builder) -> None:
    if b.shape[-1].value % 2 or b.shape[-1].value < 4:
        raise NotApplicable("SwiGLU needs an even last dim")
    b.emit("gate, up = x.chunk(2, dim=-1)")
    b.emit("x = F.silu(gate) * up")


@seed("GeGLU", "transformers.activations.GEGLU", "activation", **T)
def _geglu(b: Builder) -> None:
    if b.shape[-1].value % 2 or b.shape[-1].value < 4:
        raise NotApplicable("GeGLU needs an even last dim")
    b.emit("h, gate = x.chunk(2, dim=-1)")
    b.emit("x = h * F.gelu(gate)")


@seed("LlamaRMSNorm", "transformers.models.llama.LlamaRMSNorm", "norm", **T)
def _llama_rms(b: Builder) -> None:
    d = _last_dim_name(b, "hidden_size")
    w = b.attr("rms_weight", f"nn.Parameter(torch.ones({d}))")
    b.emit("variance = x.pow(2).mean(-1, keepdim=True)")
    b.emit(f"x = self.{w} * (x * torch.rsqrt(variance + 1e-6))")


@seed("GemmaRMSNorm", "transformers.models.gemma.GemmaRMSNorm", "norm", **T)
def _gemma_rms(b: Builder) -> None:
    d = _last_dim_name(b, "hidden_size")
    w = b.attr("rms_weight", f"nn.Parameter(0.1 * torch.randn({d}))")
    b.emit("x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)")
    b.emit(f"x = x * (1.0 + self.{w})")


# ============================================================================ elementwise math
simple("Abs", "torch.abs", "elementwise", "torch.abs(x)")
simple("Exp", "torch.exp", "elementwise", "torch.exp(x)")
simple("Log", "torch.log", "elementwise", "torch.log(torch.abs(x) + 1e-6)")
simple("Sqrt", "torch.sqrt", "elementwise", "torch.sqrt(torch.abs(x))")
simple("Rsqrt", "torch.rsqrt", "elementwise", "torch.rsqrt(torch.abs(x) + 1e-3)")
simple("Sin", "torch.sin", "elementwise", "torch.sin(x)")
simple("Cos", "torch.cos", "elementwise", "torch.cos(x)")
simple("Erf", "torch.erf", "elementwise", "torch.erf(x)")
simple("Reciprocal", "torch.reciprocal", "elementwise", "torch.reciprocal(torch.abs(x) + 1.0)")
simple("Square", "torch.square", "elementwise", "torch.square(x)")
simple("Sign", "torch.sign", "elementwise", "torch.sign(x)", not_last=True)
simple("Round", "torch.round", "elementwise", "torch.round(x * 4.0) / 4.0")
simple("Where", "torch.where", "elementwise", "torch.where(x > 0, x, 0.1 * x)")


@seed("Pow", "torch.pow", "elementwise")
def _pow(b: Builder) -> None:
    b.emit(f"x = torch.pow(x, {b.choice([2.0, 3.0])})")


@seed("Clamp", "torch.clamp", "elementwise")
def _clamp(b: Builder) -> None:
    lo = b.choice([-1.0, -0.5, 0.0])
    b.emit(f"x = torch.clamp(x, min={lo}, max={b.choice([0.5, 1.0, 2.0])})")


@seed("Scaling", "torch.mul", "elementwise")
def _scaling(b: Builder) -> None:
    s = b.const("scaling_factor", b.choice([0.5, 1.5, 2.0]))
    a = b.attr("scaling_factor", s)
    b.emit(f"x = x * self.{a}")


@seed("Divide", "torch.div", "elementwise")
def _divide(b: Builder) -> None:
    b.emit(f"x = x / {b.choice([2.0, 3.0, 4.0])}")


@seed("Subtract", "torch.sub", "elementwise")
def _subtract(b: Builder) -> None:
    b.emit(f"x = x - {b.choice([0.5, 1.0])}")


def _param_shape(b: Builder) -> tuple[int, ...]:
    """Per-channel parameter shape: (C, 1, ...) for ranks >= 3, (F,) for matrices."""
    if b.rank >= 3:
        return (b.shape[1].value,) + (1,) * (b.rank - 2)
    return (b.shape[-1].value,)


@seed("BiasAdd", "torch.add", "elementwise")
def _bias_add(b: Builder) -> None:
    bs = b.const("bias_shape", _param_shape(b))
    p = b.attr("bias", f"nn.Parameter(torch.randn({bs}) * 0.02)")
    b.emit(f"x = x + self.{p}")


@seed("Multiply", "torch.mul", "elementwise")
def _multiply(b: Builder) -> None:
    ms = b.const("multiplier_shape", _param_shape(b))
    p = b.attr("multiplier", f"nn.Parameter(torch.randn({ms}))")
    b.emit(f"x = x * self.{p}")


@seed("ResidualAdd", "torch.add", "elementwise")
def _residual(b: Builder) -> None:
    b.emit("x = x + torch.tanh(x)")


# ============================================================================ gemm


def _max_features(b: Builder) -> int:
    return {"gpu": 16384, "cpu": 4096, "tiny": 1024}[b.size]


@seed("Gemm", "nn.Linear", "gemm", ranks=(2, 3), family="matrix")
def _gemm(b: Builder) -> dict[int, str]:
    if b.shape[-1].value > _max_features(b):
        raise NotApplicable("too many input features for a Linear")
    fin = _last_dim_name(b, "in_features")
    fout = b.const("out_features", b.pick("features"))
    a = b.attr("gemm", f"nn.Linear({fin}, {fout})")
    b.emit(f"x = self.{a}(x)")
    return {b.rank - 1: fout}


@seed("Matmul", "torch.matmul", "gemm", ranks=(2, 3), family="matrix")
def _matmul(b: Builder) -> dict[int, str]:
    if b.shape[-1].value > _max_features(b):
        raise NotApplicable("too many input features for a matmul")
    k = _last_dim_name(b, "k_dim")
    n = b.const("n_dim", b.pick("features"), init=False)
    w = b.extra_input("w", f"torch.randn({k}, {n}) / {k} ** 0.5")
    b.emit(f"x = torch.matmul(x, {w})")
    return {b.rank - 1: n}


@seed("BMM", "torch.bmm", "gemm", ranks=(3,), family="seq")
def _bmm(b: Builder) -> dict[int, str]:
    k = _last_dim_name(b, "k_dim")
    n = b.const("n_dim", b.pick("embed"), init=False)
    y = b.extra_input("y", f"torch.randn({b.shape[0].expr}, {k}, {n})")
    b.emit(f"x = torch.bmm(x, {y})")
    return {2: n}


@seed("Addmm", "torch.addmm", "gemm", ranks=(2,), family="matrix")
def _addmm(b: Builder) -> dict[int, str]:
    if b.shape[-1].value > _max_features(b):
        raise NotApplicable("too many input features")
    k = _last_dim_name(b, "in_features")
    n = b.const("out_features", b.pick("features"))
    w = b.attr("weight", f"nn.Parameter(torch.randn({k}, {n}) / {k} ** 0.5)")
    bias = b.attr("bias", f"nn.Parameter(torch.zeros({n}))")
    b.emit(f"x = torch.addmm(self.{bias}, x, self.{w})")
    return {1: n}


@seed("Bilinear", "nn.Bilinear", "gemm", ranks=(2,), family="matrix")
def _bilinear(b: Builder) -> dict[int, str]:
    if b.shape[-1].value > 1024:
        raise NotApplicable("Bilinear weight would be too large")
    k = _last_dim_name(b, "in_features")
    n = b.const("out_features", b.choice([16, 32, 64]))
    a = b.attr("bilinear", f"nn.Bilinear({k}, {k}, {n})")
    b.emit(f"x = self.{a}(x, x)")
    return {1: n}


@seed("Einsum", "torch.einsum", "gemm", ranks=(3,), family="seq")
def _einsum(b: Builder) -> dict[int, str]:
    k = _last_dim_name(b, "embed_dim")
    n = b.const("proj_dim", b.pick("embed"))
    w = b.attr("proj", f"nn.Parameter(torch.randn({k}, {n}) / {k} ** 0.5)")
    b.emit(f'x = torch.einsum("bld,de->ble", x, self.{w})')
    return {2: n}


# ============================================================================ conv


def _conv(dim: int, transpose: bool = False, depthwise: bool = False):
    def build(b: Builder) -> dict[int, str]:
        cin = _chan_name(b, "in_channels")
        spatial = [d.value for d in b.shape[2:]]
        k = b.choice([3, 5] if dim < 3 else [3])
        if min(spatial) < k + 1:
            raise NotApplicable("spatial size too small for the kernel")
        if depthwise:
            cout = cin
            ks = b.const("kernel_size", k)
            ctor = f"nn.Conv{dim}d({cin}, {cin}, {ks}, padding={ks} // 2, groups={cin})"
        else:
            cout = b.const("out_channels", b.pick("channels"))
            ks = b.const("kernel_size", k)
            cls = f"ConvTranspose{dim}d" if transpose else f"Conv{dim}d"
            extra = ", stride=2, padding=1" if transpose else ""
            ctor = f"nn.{cls}({cin}, {cout}, {ks}{extra})"
        name = "conv_transpose" if transpose else "conv"
        a = b.attr(name, ctor)
        b.emit(f"x = self.{a}(x)")
        return {1: cout}

    return build


for _d in (1, 2, 3):
    seed(f"Conv{_d}d", f"nn.Conv{_d}d", "conv", ranks=(_d + 2,), family=f"image{_d}d")(_conv(_d))
    seed(
        f"ConvTranspose{_d}d",
        f"nn.ConvTranspose{_d}d",
        "conv",
        ranks=(_d + 2,),
        family=f"image{_d}d",
    )(_conv(_d, transpose=True))
seed("DepthwiseConv2d", "nn.Conv2d", "conv", ranks=(4,), family="image2d")(_conv(2, depthwise=True))


@seed("Unfold", "F.unfold", "conv", ranks=(4,), family="image2d")
def _unfold(b: Builder) -> None:
    if min(d.value for d in b.shape[2:]) < 4 or b.shape[1].value > 64:
        raise NotApplicable("Unfold needs >= 4x4 spatial and few channels")
    b.emit("x = F.unfold(x, kernel_size=3, padding=1)")


# ============================================================================ attention


def _heads(b: Builder) -> int:
    d = b.shape[-1].value
    opts = [h for h in SIZE_HEADS(b) if d % h == 0 and d // h >= 4]
    if not opts:
        raise NotApplicable("embed dim not divisible into heads")
    return b.choice(opts)


def SIZE_HEADS(b: Builder) -> list[int]:  # noqa: N802
    from .builder import SIZE_PRESETS

    return SIZE_PRESETS[b.size]["heads"]


def _sdpa(causal: bool):
    def build(b: Builder) -> None:
        h = b.const("num_heads", _heads(b), init=False)
        b.emit("bsz, seq, dim = x.shape")
        b.emit(f"x = x.view(bsz, seq, {h}, dim // {h}).transpose(1, 2)")
        c = ", is_causal=True" if causal else ""
        b.emit(f"x = F.scaled_dot_product_attention(x, x, x{c})")
        b.emit("x = x.transpose(1, 2).reshape(bsz, seq, dim)")

    return build


seed(
    "ScaledDotProductAttention",
    "F.scaled_dot_product_attention",
    "attention",
    ranks=(3,),
    family="seq",
)(_sdpa(False))
seed("CausalAttention", "F.scaled_dot_product_attention", "attention", ranks=(3,), family="seq")(
    _sdpa(True)
)


@seed("MultiheadAttention", "nn.MultiheadAttention", "attention", ranks=(3,), family="seq")
def _mha(b: Builder) -> None:
    if b.shape[-1].value > 2048:
        raise NotApplicable("embed dim too large")
    e = _last_dim_name(b, "embed_dim")
    h = b.const("num_heads", _heads(b))
    a = b.attr("attn", f"nn.MultiheadAttention({e}, {h}, batch_first=True)")
    b.emit(f"x, _ = self.{a}(x, x, x, need_weights=False)")


@seed(
    "TransformerEncoderLayer", "nn.TransformerEncoderLayer", "attention", ranks=(3,), family="seq"
)
def _tel(b: Builder) -> None:
    if b.shape[-1].value > 2048:
        raise NotApplicable("embed dim too large")
    e = _last_dim_name(b, "embed_dim")
    h = b.const("num_heads", _heads(b))
    a = b.attr(
        "encoder_layer",
        f"nn.TransformerEncoderLayer({e}, {h}, dim_feedforward=2 * {e}, dropout=0.0, batch_first=True)",
    )
    b.emit(f"x = self.{a}(x)")


# ============================================================================ recurrent


def _rnn(cls: str):
    def build(b: Builder) -> dict[int, str]:
        if b.shape[-1].value > 2048:
            raise NotApplicable("input size too large for a recurrent layer")
        i = _last_dim_name(b, "input_size")
        h = b.const("hidden_size", b.pick("embed"))
        a = b.attr(cls.lower(), f"nn.{cls}({i}, {h}, batch_first=True)")
        b.emit(f"x, _ = self.{a}(x)")
        return {2: h}

    return build


for _cls in ("LSTM", "GRU", "RNN"):
    seed(_cls, f"nn.{_cls}", "recurrent", ranks=(3,), family="seq")(_rnn(_cls))


# ============================================================================ norms


@seed("BatchNorm1d", "nn.BatchNorm1d", "norm", ranks=(2, 3), family="matrix")
def _bn1(b: Builder) -> None:
    a = b.attr("batch_norm", f"nn.BatchNorm1d({_chan_name(b, 'num_features')})")
    b.emit(f"x = self.{a}(x)")


@seed("BatchNorm2d", "nn.BatchNorm2d", "norm", ranks=(4,), family="image2d")
def _bn2(b: Builder) -> None:
    a = b.attr("batch_norm", f"nn.BatchNorm2d({_chan_name(b, 'num_features')})")
    b.emit(f"x = self.{a}(x)")


@seed("BatchNorm3d", "nn.BatchNorm3d", "norm", ranks=(5,), family="image3d")
def _bn3(b: Builder) -> None:
    a = b.attr("batch_norm", f"nn.BatchNorm3d({_chan_name(b, 'num_features')})")
    b.emit(f"x = self.{a}(x)")


@seed("LayerNorm", "nn.LayerNorm", "norm", ranks=(2, 3, 4))
def _ln(b: Builder) -> None:
    _dim_of_size(b, [-1])
    a = b.attr("layer_norm", f"nn.LayerNorm({_last_dim_name(b, 'normalized_shape')})")
    b.emit(f"x = self.{a}(x)")


@seed("RMSNorm", "nn.RMSNorm", "norm", ranks=(2, 3, 4))
def _rms(b: Builder) -> None:
    _dim_of_size(b, [-1])
    a = b.attr("rms_norm", f"nn.RMSNorm({_last_dim_name(b, 'normalized_shape')})")
    b.emit(f"x = self.{a}(x)")


@seed("GroupNorm", "nn.GroupNorm", "norm", ranks=(3, 4, 5), family="image2d")
def _gn(b: Builder) -> None:
    c = b.shape[1].value
    groups = _divisors(c, [8, 4, 2])
    if not groups or c < 4:
        raise NotApplicable("channels not divisible into groups")
    g = b.const("num_groups", groups[0])
    a = b.attr("group_norm", f"nn.GroupNorm({g}, {_chan_name(b)})")
    b.emit(f"x = self.{a}(x)")


for _d in (1, 2, 3):

    def _inorm(b: Builder, _d: int = _d) -> None:
        if min(d.value for d in b.shape[2:]) < 2:
            raise NotApplicable("InstanceNorm needs more than one spatial element")
        a = b.attr("instance_norm", f"nn.InstanceNorm{_d}d({_chan_name(b, 'num_features')})")
        b.emit(f"x = self.{a}(x)")

    seed(f"InstanceNorm{_d}d", f"nn.InstanceNorm{_d}d", "norm", ranks=(_d + 2,))(_inorm)


@seed("LocalResponseNorm", "nn.LocalResponseNorm", "norm", ranks=(3, 4), family="image2d")
def _lrn(b: Builder) -> None:
    a = b.attr("lrn", f"nn.LocalResponseNorm(size={b.choice([2, 3, 5])})")
    b.emit(f"x = self.{a}(x)")


@seed("L2Normalize", "F.normalize", "norm")
def _l2(b: Builder) -> None:
    b.emit(f"x = F.normalize(x, p=2.0, dim={_dim_of_size(b, [1, -1])})")


# ============================================================================ pooling


def _pool(kind: str, dim: int):
    def build(b: Builder) -> None:
        if min(d.value for d in b.shape[2:]) < 4:
            raise NotApplicable("spatial size too small to pool")
        k = b.choice([2, 3] if dim < 3 else [2])
        if kind == "LP":
            a = b.attr("pool", f"nn.LPPool{dim}d(2, kernel_size={k})")
        else:
            a = b.attr("pool", f"nn.{kind}Pool{dim}d(kernel_size={k})")
        b.emit(f"x = self.{a}(x)")

    return build


for _d in (1, 2, 3):
    seed(f"MaxPool{_d}d", f"nn.MaxPool{_d}d", "pooling", ranks=(_d + 2,))(_pool("Max", _d))
    seed(f"AvgPool{_d}d", f"nn.AvgPool{_d}d", "pooling", ranks=(_d + 2,))(_pool("Avg", _d))
seed("LPPool2d", "nn.LPPool2d", "pooling", ranks=(4,))(_pool("LP", 2))


@seed("AdaptiveAvgPool2d", "F.adaptive_avg_pool2d", "pooling", ranks=(4,))
def _aap(b: Builder) -> None:
    b.emit(f"x = F.adaptive_avg_pool2d(x, {b.choice([1, 2, 4])})")


@seed("AdaptiveMaxPool2d", "F.adaptive_max_pool2d", "pooling", ranks=(4,))
def _amp(b: Builder) -> None:
    b.emit(f"x = F.adaptive_max_pool2d(x, {b.choice([1, 2, 4])})")


@seed("AdaptiveAvgPool1d", "F.adaptive_avg_pool1d", "pooling", ranks=(3,))
def _aap1(b: Builder) -> None:
    b.emit(f"x = F.adaptive_avg_pool1d(x, {b.choice([1, 4, 8])})")


@seed("GlobalAvgPool", "torch.mean", "pooling", ranks=(4, 5))
def _gap(b: Builder) -> None:
    dims = tuple(range(2, b.rank))
    b.emit(f"x = torch.mean(x, dim={dims}, keepdim=True)")


# ============================================================================ resampling


@seed("Upsample", "nn.Upsample", "resample", ranks=(3, 4))
def _upsample(b: Builder) -> None:
    a = b.attr("upsample", 'nn.Upsample(scale_factor=2, mode="nearest")')
    b.emit(f"x = self.{a}(x)")


@seed("BilinearInterpolate", "F.interpolate", "resample", ranks=(4,))
def _interp(b: Builder) -> None:
    b.emit('x = F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)')


@seed("PixelShuffle", "nn.PixelShuffle", "resample", ranks=(4,))
def _pshuffle(b: Builder) -> None:
    if b.shape[1].value % 4:
        raise NotApplicable("PixelShuffle(2) needs channels divisible by 4")
    a = b.attr("pixel_shuffle", "nn.PixelShuffle(2)")
    b.emit(f"x = self.{a}(x)")


@seed("PixelUnshuffle", "nn.PixelUnshuffle", "resample", ranks=(4,))
def _punshuffle(b: Builder) -> None:
    if b.shape[2].value % 2 or b.shape[3].value % 2:
        raise NotApplicable("PixelUnshuffle(2) needs even height and width")
    a = b.attr("pixel_unshuffle", "nn.PixelUnshuffle(2)")
    b.emit(f"x = self.{a}(x)")


# ============================================================================ reductions


def _red(expr: str, name: str, keepdim_ok: bool = True):
    def build(b: Builder) -> None:
        dim = b.choice([1, -1]) if b.rank > 1 else 0
        kd = ", keepdim=True" if keepdim_ok and b.choice([True, False]) and b.rank <= 2 else ""
        b.emit("x = " + expr.format(dim=dim, kd=kd))

    return build


for _n, _op, _e in [
    ("Sum", "torch.sum", "torch.sum(x, dim={dim}{kd})"),
    ("Mean", "torch.mean", "torch.mean(x, dim={dim}{kd})"),
    ("Max", "torch.amax", "torch.amax(x, dim={dim}{kd})"),
    ("Min", "torch.amin", "torch.amin(x, dim={dim}{kd})"),
    ("Norm", "torch.linalg.vector_norm", "torch.linalg.vector_norm(x, dim={dim}{kd})"),
    ("Std", "torch.std", "torch.std(x, dim={dim}{kd})"),
    ("Var", "torch.var", "torch.var(x, dim={dim}{kd})"),
    ("LogSumExp", "torch.logsumexp", "torch.logsumexp(x, dim={dim}{kd})"),
]:
    seed(_n, _op, "reduction")(_red(_e, _n))


@seed("Prod", "torch.prod", "reduction")
def _prod(b: Builder) -> None:
    # product over a short dim only (a long product of N(0,1) values underflows to 0)
    i = min(range(1, b.rank), key=lambda j: b.shape[j].value)
    if b.shape[i].value > 16:
        b.emit(f"x = torch.prod(1.0 + 0.05 * torch.tanh(x), dim={i})")
    else:
        b.emit(f"x = torch.prod(x, dim={i})")


@seed("Argmax", "torch.argmax", "reduction", terminal=True)
def _argmax(b: Builder) -> None:
    b.emit(f"x = torch.argmax(x, dim={b.choice([1, -1])})")


@seed("Argmin", "torch.argmin", "reduction", terminal=True)
def _argmin(b: Builder) -> None:
    b.emit(f"x = torch.argmin(x, dim={b.choice([1, -1])})")


# ============================================================================ scans


def _scan(expr: str):
    def build(b: Builder) -> None:
        dim = b.choice([1, -1])
        b.emit("x = " + expr.format(dim=dim))

    return build


for _n, _op, _e in [
    ("Cumsum", "torch.cumsum", "torch.cumsum(x, dim={dim})"),
    ("Cumprod", "torch.cumprod", "torch.cumprod(1.0 + 0.1 * torch.tanh(x), dim={dim})"),
    ("Cummax", "torch.cummax", "torch.cummax(x, dim={dim}).values"),
    ("Cummin", "torch.cummin", "torch.cummin(x, dim={dim}).values"),
    ("LogCumSumExp", "torch.logcumsumexp", "torch.logcumsumexp(x, dim={dim})"),
    ("ReverseCumsum", "torch.cumsum", "torch.cumsum(x.flip({dim}), dim={dim}).flip({dim})"),
    (
        "ExclusiveCumsum",
        "torch.cumsum",
        "torch.cumsum(x, dim={dim}) - x",
    ),
]:
    seed(_n, _op, "scan")(_scan(_e))


# ============================================================================ indexing


@seed("Gather", "torch.gather", "indexing")
def _gather(b: Builder) -> None:
    n = b.shape[-1].value
    idx = b.extra_input("index", f"torch.randint(0, {n}, {_tup(b)})")
    b.emit(f"x = torch.gather(x, -1, {idx})")


@seed("IndexSelect", "torch.index_select", "indexing")
def _index_select(b: Builder) -> None:
    n = b.shape[-1].value
    k = max(1, n // 2)
    b.init_lines.append(f'self.register_buffer("idx", torch.arange(0, {n}, 2)[:{k}])')
    b.emit("x = torch.index_select(x, -1, self.idx)")


@seed("Narrow", "torch.narrow", "indexing")
def _narrow(b: Builder) -> None:
    n = b.shape[1].value
    if n < 2:
        raise NotApplicable("dim too short")
    b.emit(f"x = torch.narrow(x, 1, {n // 4}, {n - n // 4 - n // 4 or 1})")


simple("Flip", "torch.flip", "indexing", "torch.flip(x, dims=[-1])")
simple("Roll", "torch.roll", "indexing", "torch.roll(x, shifts=1, dims=-1)")
simple("Tril", "torch.tril", "indexing", "torch.tril(x)")
simple("Triu", "torch.triu", "indexing", "torch.triu(x)")
simple("MaskedFill", "torch.Tensor.masked_fill", "indexing", "x.masked_fill(x < -1.0, 0.0)")


@seed("TopK", "torch.topk", "indexing")
def _topk(b: Builder) -> None:
    n = b.shape[-1].value
    k = max(1, min(8, n // 2))
    b.emit(f"x = torch.topk(x, {k}, dim=-1).values")


@seed("Sort", "torch.sort", "indexing")
def _sort(b: Builder) -> None:
    b.emit("x = torch.sort(x, dim=-1).values")


@seed("Transpose", "torch.transpose", "indexing", ranks=(3, 4))
def _transpose(b: Builder) -> None:
    b.emit("x = torch.transpose(x, 1, 2).contiguous()")


@seed("ScatterAdd", "torch.scatter_add", "indexing")
def _scatter(b: Builder) -> None:
    n = b.shape[-1].value
    idx = b.extra_input("index", f"torch.randint(0, {n}, {_tup(b)})")
    b.emit(f"x = torch.zeros_like(x).scatter_add(-1, {idx}, x)")


@seed("Embedding", "nn.Embedding", "indexing", ranks=(2,), first_only=True)
def _embedding(b: Builder) -> dict[int, str]:
    # first stage only: replaces the float input with token ids
    vocab = b.const("vocab_size", {"gpu": 32000, "cpu": 8000, "tiny": 100}[b.size])
    d = b.const("embed_dim", b.pick("embed"))
    bs, seq = b.shape[0].expr, b.shape[1].expr
    b.inputs[0] = ("x", f"torch.randint(0, {vocab}, ({bs}, {seq}))")
    a = b.attr("embedding", f"nn.Embedding({vocab}, {d})")
    b.emit(f"x = self.{a}(x)")
    return {2: d}


# ============================================================================ losses (terminal)


def per_sample(call: str) -> str:
    """``F.mse_loss(x, t)`` -> ``F.mse_loss(x, t, reduction="none")``.

    A batch-mean loss is one scalar that barely moves when the inputs change (a constant passes
    a 1e-2 tolerance), so composed losses are per sample; see the README.
    """
    if 'reduction="batchmean"' in call:
        return call.replace('reduction="batchmean"', 'reduction="none"')
    return call[:-1] + ', reduction="none")'


def _per_sample_mean(b: Builder) -> None:
    b.update_shape()
    if b.rank >= 2:
        b.emit("x = x.reshape(x.shape[0], -1).mean(dim=1)")


def _loss(expr: str, target: str = "torch.randn({shape})", ranks=None, **kw):
    def build(b: Builder) -> None:
        t = b.extra_input("target", target.format(shape=b.shape_expr(), tup=_tup(b), **_dims(b)))
        b.emit("x = " + per_sample(expr.format(t=t)))
        _per_sample_mean(b)

    return build


def _tup(b: Builder) -> str:
    """The current shape as a tuple literal, e.g. ``(batch_size, 16)`` or ``(batch_size,)``."""
    e = b.shape_expr()
    return f"({e},)" if b.rank == 1 else f"({e})"


def _dims(b: Builder) -> dict[str, str]:
    return {"b": b.shape[0].expr, "c": b.shape[1].expr}


for _n, _op, _e, _t, _r in [
    ("MSELoss", "F.mse_loss", "F.mse_loss(x, {t})", "torch.randn({shape})", None),
    ("L1Loss", "F.l1_loss", "F.l1_loss(x, {t})", "torch.randn({shape})", None),
    ("SmoothL1Loss", "F.smooth_l1_loss", "F.smooth_l1_loss(x, {t})", "torch.randn({shape})", None),
    ("HuberLoss", "F.huber_loss", "F.huber_loss(x, {t}, delta=1.0)", "torch.randn({shape})", None),
    (
        "CrossEntropyLoss",
        "F.cross_entropy",
        "F.cross_entropy(x, {t})",
        "torch.randint(0, {c}, ({b},))",
        (2,),
    ),
    (
        "NLLLoss",
        "F.nll_loss",
        "F.nll_loss(F.log_softmax(x, dim=1), {t})",
        "torch.randint(0, {c}, ({b},))",
        (2,),
    ),
    (
        "KLDivLoss",
        "F.kl_div",
        'F.kl_div(F.log_softmax(x, dim=-1), {t}, reduction="batchmean")',
        "torch.softmax(torch.randn({shape}), dim=-1)",
        None,
    ),
    (
        "BCEWithLogitsLoss",
        "F.binary_cross_entropy_with_logits",
        "F.binary_cross_entropy_with_logits(x, {t})",
        "torch.rand({shape})",
        None,
    ),
    (
        "HingeEmbeddingLoss",
        "F.hinge_embedding_loss",
        "F.hinge_embedding_loss(x, {t})",
        "torch.randint(0, 2, {tup}).float() * 2 - 1",
        None,
    ),
    (
        "SoftMarginLoss",
        "F.soft_margin_loss",
        "F.soft_margin_loss(x, {t})",
        "torch.randint(0, 2, {tup}).float() * 2 - 1",
        None,
    ),
    (
        "PoissonNLLLoss",
        "F.poisson_nll_loss",
        "F.poisson_nll_loss(x, {t})",
        "torch.rand({shape}) * 4",
        None,
    ),
    (
        "MultiLabelSoftMarginLoss",
        "F.multilabel_soft_margin_loss",
        "F.multilabel_soft_margin_loss(x, {t})",
        "torch.randint(0, 2, ({b}, {c})).float()",
        (2,),
    ),
    (
        "MarginRankingLoss",
        "F.margin_ranking_loss",
        "F.margin_ranking_loss(x, x.flip(-1), {t}, margin=0.1)",
        "torch.randint(0, 2, {tup}).float() * 2 - 1",
        None,
    ),
]:
    seed(_n, _op, "loss", ranks=_r, terminal=True)(_loss(_e, _t))


@seed("TripletMarginLoss", "F.triplet_margin_loss", "loss", ranks=(2,), terminal=True)
def _triplet(b: Builder) -> None:
    p = b.extra_input("positive", f"torch.randn({b.shape_expr()})")
    n = b.extra_input("negative", f"torch.randn({b.shape_expr()})")
    b.emit(f'x = F.triplet_margin_loss(x, {p}, {n}, margin=1.0, reduction="none")')


@seed("CosineEmbeddingLoss", "F.cosine_embedding_loss", "loss", ranks=(2,), terminal=True)
def _cos_emb(b: Builder) -> None:
    y = b.extra_input("other", f"torch.randn({b.shape_expr()})")
    t = b.extra_input("target", f"torch.randint(0, 2, ({b.shape[0].expr},)).float() * 2 - 1")
    b.emit(f'x = F.cosine_embedding_loss(x, {y}, {t}, reduction="none")')


# ============================================================================ distances


@seed("CosineSimilarity", "F.cosine_similarity", "distance")
def _cos(b: Builder) -> None:
    y = b.extra_input("other", f"torch.randn({b.shape_expr()})")
    b.emit(f"x = F.cosine_similarity(x, {y}, dim=-1)")


@seed("PairwiseDistance", "F.pairwise_distance", "distance", ranks=(2, 3))
def _pdist(b: Builder) -> None:
    y = b.extra_input("other", f"torch.randn({b.shape_expr()})")
    b.emit(f"x = F.pairwise_distance(x, {y})")


@seed("Cdist", "torch.cdist", "distance", ranks=(3,), family="seq")
def _cdist(b: Builder) -> None:
    b.emit("x = torch.cdist(x, x)")


# ============================================================================ more torch seeds
# elementwise math (domains made legal the way a composed program would)
for _n, _op, _e in [
    ("Expm1", "torch.expm1", "torch.expm1(x)"),
    ("Log1p", "torch.log1p", "torch.log1p(torch.abs(x))"),
    ("Log2", "torch.log2", "torch.log2(torch.abs(x) + 1.0)"),
    ("Log10", "torch.log10", "torch.log10(torch.abs(x) + 1.0)"),
    ("Atan", "torch.atan", "torch.atan(x)"),
    ("Asinh", "torch.asinh", "torch.asinh(x)"),
    ("Sinh", "torch.sinh", "torch.sinh(x)"),
    ("Cosh", "torch.cosh", "torch.cosh(x)"),
    ("Tan", "torch.tan", "torch.tan(0.5 * torch.tanh(x))"),
    ("Erfc", "torch.erfc", "torch.erfc(x)"),
    ("Erfinv", "torch.erfinv", "torch.erfinv(0.9 * torch.tanh(x))"),
    ("Digamma", "torch.digamma", "torch.digamma(torch.abs(x) + 1.0)"),
    ("Lgamma", "torch.lgamma", "torch.lgamma(torch.abs(x) + 1.0)"),
    ("Logit", "torch.logit", "torch.logit(torch.sigmoid(x), eps=1e-6)"),
    ("Frac", "torch.frac", "torch.frac(x * 3.0)"),
    ("Trunc", "torch.trunc", "torch.trunc(x * 4.0) / 4.0"),
    ("Ceil", "torch.ceil", "torch.ceil(x * 4.0) / 4.0"),
    ("Floor", "torch.floor", "torch.floor(x * 4.0) / 4.0"),
    ("Fmod", "torch.fmod", "torch.fmod(x, 0.75)"),
    ("Remainder", "torch.remainder", "torch.remainder(x, 0.75)"),
    ("Hypot", "torch.hypot", "torch.hypot(x, x.flip(-1))"),
    ("Atan2", "torch.atan2", "torch.atan2(x, x.flip(-1) + 0.5)"),
    ("Maximum", "torch.maximum", "torch.maximum(x, x.flip(-1))"),
    ("Minimum", "torch.minimum", "torch.minimum(x, x.flip(-1))"),
    ("Xlogy", "torch.xlogy", "torch.xlogy(x, torch.abs(x) + 1.0)"),
    ("Addcmul", "torch.addcmul", "torch.addcmul(x, x, x.flip(-1), value=0.5)"),
    ("Lerp", "torch.lerp", "torch.lerp(x, torch.tanh(x), 0.3)"),
    ("NanToNum", "torch.nan_to_num", "torch.nan_to_num(torch.log(x), nan=0.0, neginf=-10.0)"),
]:
    simple(_n, _op, "elementwise", _e)

simple("Softmax2d", "nn.Softmax2d", "activation", "torch.softmax(x, dim=-3)", ranks=(4,))


@seed("Diff", "torch.diff", "elementwise")
def _diff(b: Builder) -> None:
    _dim_of_size(b, [-1], 3)
    b.emit("x = torch.diff(x, dim=-1)")


# reductions
for _n, _op, _e in [
    ("Median", "torch.median", "torch.median(x, dim={dim}).values"),
    ("Quantile", "torch.quantile", "torch.quantile(x, 0.9, dim={dim})"),
    ("Aminmax", "torch.aminmax", "torch.aminmax(x, dim={dim}).max"),
    ("CountNonzero", "torch.count_nonzero", "torch.count_nonzero(x > 0.5, dim={dim}).float()"),
    ("Mode", "torch.mode", "torch.mode(torch.round(x * 2.0), dim={dim}).values"),
]:
    seed(_n, _op, "reduction")(_scan(_e))

# padding and layout-changing indexing
for _n, _op, _ctor, _r in [
    ("ZeroPad2d", "nn.ZeroPad2d", "nn.ZeroPad2d(1)", (4,)),
    ("ReflectionPad2d", "nn.ReflectionPad2d", "nn.ReflectionPad2d(1)", (4,)),
    ("ReplicationPad2d", "nn.ReplicationPad2d", "nn.ReplicationPad2d(1)", (4,)),
    ("ReflectionPad1d", "nn.ReflectionPad1d", "nn.ReflectionPad1d(2)", (3,)),
    ("CircularPad2d", "nn.CircularPad2d", "nn.CircularPad2d(1)", (4,)),
    ("ConstantPad3d", "nn.ConstantPad3d", "nn.ConstantPad3d(1, 0.5)", (5,)),
]:
    module(_n, _op, "indexing", _ctor, ranks=_r)


@seed("ChannelShuffle", "nn.ChannelShuffle", "indexing", ranks=(4,))
def _chshuffle(b: Builder) -> None:
    if b.shape[1].value % 2 or b.shape[1].value < 4:
        raise NotApplicable("ChannelShuffle(2) needs an even channel count")
    a = b.attr("channel_shuffle", "nn.ChannelShuffle(2)")
    b.emit(f"x = self.{a}(x)")


@seed("RepeatInterleave", "torch.repeat_interleave", "indexing")
def _repeat(b: Builder) -> None:
    b.emit("x = torch.repeat_interleave(x, 2, dim=-1)")


@seed("Diagonal", "torch.diagonal", "indexing", ranks=(3, 4))
def _diagonal(b: Builder) -> None:
    b.emit("x = torch.diagonal(x, dim1=-2, dim2=-1)")


@seed("Concat", "torch.cat", "indexing")
def _cat(b: Builder) -> None:
    b.emit("x = torch.cat([x, torch.relu(x)], dim=1)")


# pooling / resampling
seed("LPPool1d", "nn.LPPool1d", "pooling", ranks=(3,))(_pool("LP", 1))


@seed("AdaptiveMaxPool1d", "F.adaptive_max_pool1d", "pooling", ranks=(3,))
def _amp1(b: Builder) -> None:
    b.emit(f"x = F.adaptive_max_pool1d(x, {b.choice([1, 4, 8])})")


@seed("AdaptiveAvgPool3d", "F.adaptive_avg_pool3d", "pooling", ranks=(5,))
def _aap3(b: Builder) -> None:
    b.emit(f"x = F.adaptive_avg_pool3d(x, {b.choice([1, 2])})")


@seed("TrilinearInterpolate", "F.interpolate", "resample", ranks=(5,))
def _tri(b: Builder) -> None:
    b.emit('x = F.interpolate(x, scale_factor=2.0, mode="trilinear", align_corners=False)')


@seed("GridSample", "F.grid_sample", "resample", ranks=(4,))
def _grid(b: Builder) -> None:
    theta = b.attr("theta", "nn.Parameter(torch.eye(2, 3) + 0.05 * torch.randn(2, 3))")
    b.emit(
        f"grid = F.affine_grid(self.{theta}.expand(x.shape[0], 2, 3), list(x.shape), "
        "align_corners=False)"
    )
    b.emit("x = F.grid_sample(x, grid, align_corners=False)")


# gemm variants
@seed("Baddbmm", "torch.baddbmm", "gemm", ranks=(3,), family="seq")
def _baddbmm(b: Builder) -> dict[int, str]:
    k = _last_dim_name(b, "k_dim")
    n = b.const("n_dim", b.pick("embed"), init=False)
    y = b.extra_input("y", f"torch.randn({b.shape[0].expr}, {k}, {n})")
    bias = b.attr("bias", f"nn.Parameter(torch.zeros(1, 1, {n}))")
    b.emit(f"x = torch.baddbmm(self.{bias}, x, {y}, alpha=0.5)")
    return {2: n}


@seed("Outer", "torch.outer", "gemm", ranks=(2,), family="matrix")
def _outer(b: Builder) -> None:
    if b.shape[-1].value > 1024:
        raise NotApplicable("outer product too large")
    b.emit('x = torch.einsum("bi,bj->bij", x, x).flatten(1)')


@seed("Mv", "torch.mv", "gemm", ranks=(2,), family="matrix", terminal=True)
def _mv(b: Builder) -> None:
    k = _last_dim_name(b, "in_features")
    v = b.attr("vec", f"nn.Parameter(torch.randn({k}) / {k} ** 0.5)")
    b.emit(f"x = torch.mv(x, self.{v})")


@seed(
    "TransformerDecoderLayer", "nn.TransformerDecoderLayer", "attention", ranks=(3,), family="seq"
)
def _tdl(b: Builder) -> None:
    if b.shape[-1].value > 2048:
        raise NotApplicable("embed dim too large")
    e = _last_dim_name(b, "embed_dim")
    h = b.const("num_heads", _heads(b))
    a = b.attr(
        "decoder_layer",
        f"nn.TransformerDecoderLayer({e}, {h}, dim_feedforward=2 * {e}, dropout=0.0, batch_first=True)",
    )
    b.emit(f"x = self.{a}(x, x)")


@seed("GRUCell", "nn.GRUCell", "recurrent", ranks=(2,), family="matrix")
def _grucell(b: Builder) -> dict[int, str]:
    if b.shape[-1].value > 4096:
        raise NotApplicable("input too large for a GRUCell")
    i = _last_dim_name(b, "input_size")
    h = b.const("hidden_size", b.pick("features"))
    a = b.attr("cell", f"nn.GRUCell({i}, {h})")
    b.emit(f"x = self.{a}(x)")
    return {1: h}


# losses and distances
for _n, _op, _e, _t, _r in [
    (
        "BCELoss",
        "F.binary_cross_entropy",
        "F.binary_cross_entropy(torch.sigmoid(x), {t})",
        "torch.rand({shape})",
        None,
    ),
    (
        "MultiMarginLoss",
        "F.multi_margin_loss",
        "F.multi_margin_loss(x, {t})",
        "torch.randint(0, {c}, ({b},))",
        (2,),
    ),
]:
    seed(_n, _op, "loss", ranks=_r, terminal=True)(_loss(_e, _t))


@seed("Pdist", "F.pdist", "distance", ranks=(2,), terminal=True)
def _pd(b: Builder) -> None:
    if b.shape[0].value > 512:
        raise NotApplicable("pdist output grows with batch^2")
    b.emit("x = F.pdist(x)")


def seeds(categories: list[str] | None = None, include_stochastic: bool = True) -> dict[str, Seed]:
    """The catalogue, optionally restricted to ``categories`` and without stochastic seeds."""
    out = {}
    for n, s in SEEDS.items():
        if categories and s.category not in categories:
            continue
        if not include_stochastic and s.stochastic_hint:
            continue
        out[n] = s
    return out


__all__ = ["CATEGORIES", "SEEDS", "Seed", "seeds", "Dim"]
