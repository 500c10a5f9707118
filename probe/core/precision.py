"""How far a half-precision score may move by rounding alone: the self-check's tolerance, measured per model.

A bf16 (or fp16) forward rounds every intermediate result, and two correct computations of one score (the
shared-prefix fast path and the model's own forward) round differently. How far that moves a score depends on
the model (depth, width, activation outliers, the head) and the hardware's kernels, not on how far the scores
of different tokens lie apart, so a tolerance drawn from the scores' spread is too loose on one model and too
tight on another. Instead the self-check measures the model's sensitivity to rounding on the very rows it
checks: the reference forward is run again with stochastic rounding simulated on every module's output (each
value moved by a uniform random fraction of one unit roundoff, so that it may round to its other neighbour),
`ROUNDING_REPEATS` times, and the *rounding noise* is the largest change of any row's score.

Measured (``experiments/bf16_tolerance.py``, results in ``experiments/results/bf16_tolerance_cpu.md``): on the
tiny Llama, Gemma 2/3, Qwen 2/3 reward models, log-probability and judge heads, the real SmolLM2-135M (log-prob
and reward head) and Gemma 3 270M, under AVX-512 and AVX2 kernels, the largest disagreement between the bf16
fast path and the model's own bf16 forward was 0.21-0.61 times the rounding noise measured on the same rows,
and the model's own bf16 forward was 0.29-0.62 times it away from float32 (measured on two rows only, as the
social benchmark checks: at most 0.72), while the noise itself ranged from 0.005 to 1.6 over those models (the
old rule, 0.05 x (1 + spread), was 22 x the real disagreement on the tiny log-prob model and 2 x on SmolLM2, and
about 0.1 on the 8-row check of the tiny reward model, under the 0.117 the first shared-prefix kernel reached
there with AVX2 kernels). `HALF_TOLERANCE` = 2 x noise keeps a margin of 2.8 over the worst ratio seen.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import numpy as np
import torch

ROUNDING_REPEATS = 4
HALF_TOLERANCE = 2.0  # x the measured rounding noise
FLOAT32_RTOL = 1e-3  # float32: the two paths agree to ~1e-5 relative (tests); 1e-3 x (1 + |ref|)


def is_half(dtype: torch.dtype) -> bool:
    return dtype in (torch.float16, torch.bfloat16)


def roundings_per_output(device_type: str, dtype: torch.dtype) -> int:
    """How many roundings of unit size a module's output carries on this device, beyond what the module outputs
    themselves show. On a CPU, 1: the store of the output (the CPU kernels the model runs accumulate in float32 and
    round once). On CUDA in half precision, roundings happen inside functions that are no modules, so the hooks of
    `simulated_rounding` cannot see them; from the kernels' documented precision:

    * attention: FlashAttention (SDPA's flash and memory-efficient kernels) rounds the softmax probabilities to the
      input dtype before multiplying them with the values; the eager path (Gemma 2's soft-capped scores) rounds
      the scores and the probabilities to bf16: one more rounding of the attention's output (a weighted mean of
      values whose weights each carry one rounding moves by at most one unit roundoff).
    * cuBLAS reduced-precision reductions: with ``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction``
      (``allow_fp16_...`` for float16; both on by default) a split-K GEMM may sum its partial products in the half
      dtype: one more rounding of each linear layer's output.

    Each is counted as a unit of amplitude at every module output (a bound: it also widens modules that do
    neither). The first GPU runs must measure how far the real disagreement stays below the tolerance
    (experiments/bf16_tolerance.py on CUDA)."""
    if device_type != "cuda" or not is_half(dtype):
        return 1
    matmul = torch.backends.cuda.matmul
    reduced = (matmul.allow_bf16_reduced_precision_reduction if dtype == torch.bfloat16
               else matmul.allow_fp16_reduced_precision_reduction)
    return 2 + int(bool(reduced))


@contextlib.contextmanager
def simulated_rounding(model: torch.nn.Module, seed: int, units: float | int = 1) -> Iterator[None]:
    """Inside: every floating-point tensor a module of ``model`` returns is moved by ``x * U(-units u, units u)``,
    ``u`` the unit roundoff of its dtype, so that each value may land on either neighbour when it is stored, as
    another correct order of computation may round it (``units`` > 1: roundings the module does inside, see
    `roundings_per_output`). Seeded: the same ``seed`` gives the same perturbation."""
    generators: dict[torch.device, torch.Generator] = {}

    def hook(module, args, out):
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return None
        g = generators.get(out.device)
        if g is None:
            g = generators[out.device] = torch.Generator(device=out.device).manual_seed(seed)
        u = units * torch.finfo(out.dtype).eps / 2
        return out.addcmul(out, torch.empty_like(out).uniform_(-u, u, generator=g))

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def rounding_noise(models: torch.nn.Module | tuple[torch.nn.Module, ...], reference: Callable[[], np.ndarray],
                   ref: np.ndarray, repeats: int = ROUNDING_REPEATS) -> float:
    """The largest change of any score of ``reference()`` (the models' own forward over the checked rows, whose
    plain result is ``ref``) under `simulated_rounding` of every model at once, over ``repeats`` seeds, each
    model's outputs moved by as many units as `roundings_per_output` gives for its device and dtype."""
    models = models if isinstance(models, tuple) else (models,)
    noise = 0.0
    for seed in range(repeats):
        with contextlib.ExitStack() as stack:
            for k, model in enumerate(models):
                param = next(model.parameters())
                units = roundings_per_output(param.device.type, param.dtype)
                stack.enter_context(simulated_rounding(model, seed + 1000 * k, units))
            noise = max(noise, float(np.max(np.abs(reference() - ref))))
    return noise


def tolerance(ref: np.ndarray, dtype: torch.dtype, noise: float | None = None) -> np.ndarray:
    """How far the fast path may be from the model's own forward, per row: float32 ``1e-3 * (1 + |ref|)``; half
    precision ``HALF_TOLERANCE x noise`` (`rounding_noise`, required), never below the float32 rule."""
    floor = FLOAT32_RTOL * (1 + np.abs(ref))
    if not is_half(dtype):
        return floor
    if noise is None:
        raise ValueError("a half-precision tolerance needs the measured rounding noise")
    return np.maximum(floor, HALF_TOLERANCE * noise)
