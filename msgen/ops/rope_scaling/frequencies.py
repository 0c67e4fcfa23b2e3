"""RoPE's inverse frequencies and attention factor: transformers 4.57's
`modeling_rope_utils` in numpy, step for step in float32 as its torch code runs.

Below the imports, numpy and math only: generated model code carries this source as
it is (`frequencies_source`), so msgen, its tests and the generated cells compute the
frequencies by one definition.
"""

import math

import numpy as np


def rope_frequencies(dim, theta, scaling=None, params=None):
    """RoPE's inverse frequencies, float32 [dim // 2], and the factor cos and sin are
    multiplied by (attention_factor), for base `theta` under `scaling` (None, "linear",
    "llama3" or "yarn") with its `params`: transformers 4.57's modeling_rope_utils."""
    exponents = np.arange(0, dim, 2).astype(np.float32) / np.float32(dim)
    powers = np.power(np.float32(theta), exponents)
    if scaling == "yarn":
        return _yarn(dim, theta, powers, params)
    inv_freq = np.float32(1.0) / powers
    if scaling == "linear":
        inv_freq = _linear(inv_freq, params)
    elif scaling == "llama3":
        inv_freq = _llama3(inv_freq, params)
    return inv_freq, 1.0


def _linear(inv_freq, params):
    """Positions divided by `factor`: the same as the frequencies."""
    return inv_freq / np.float32(params["factor"])


def _llama3(inv_freq, params):
    """Llama 3.1: wavelengths above original / low_freq_factor divided by `factor`,
    below original / high_freq_factor kept, those between blended by a linear ramp."""
    factor = np.float32(params["factor"])
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    old_context = params["original_max_position_embeddings"]
    low_freq_wavelen = np.float32(old_context / low)
    high_freq_wavelen = np.float32(old_context / high)
    # torch divides a number by a tensor as the tensor's reciprocal times the number
    wavelen = (np.float32(1) / inv_freq) * np.float32(2 * math.pi)
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    ratio = (np.float32(1) / wavelen) * np.float32(old_context)
    smooth = (ratio - np.float32(low)) / np.float32(high - low)
    smoothed = (np.float32(1) - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _yarn_factor(scale, mscale=1.0):
    """YaRN's attention temperature, 0.1 * mscale * ln(scale) + 1 (1 when unscaled)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _yarn(dim, theta, powers, params):
    """YaRN (Peng et al. 2023): frequencies that turn fewer than beta_slow times over
    the original context interpolated (divided by `factor`), more than beta_fast times
    kept, a linear ramp between; cos and sin scaled by the attention factor."""
    factor = params["factor"]
    attention_factor = params.get("attention_factor")
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if attention_factor is None and mscale and mscale_all_dim:
        ratio = _yarn_factor(factor, mscale) / _yarn_factor(factor, mscale_all_dim)
        attention_factor = float(ratio)
    elif attention_factor is None:
        attention_factor = _yarn_factor(factor)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1
    context = params["original_max_position_embeddings"]

    def correction_dim(rotations):
        turns = math.log(context / (rotations * 2 * math.pi))
        return (dim * turns) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # the ramp would divide by zero
    bands = np.arange(dim // 2).astype(np.float32)
    ramp = np.clip((bands - np.float32(low)) / np.float32(high - low), 0, 1)
    extrapolation = np.float32(1) - ramp.astype(np.float32)
    inv_extrapolation = np.float32(1.0) / powers
    inv_interpolation = np.float32(1.0) / (np.float32(factor) * powers)
    interpolated = inv_interpolation * (np.float32(1) - extrapolation)
    inv_freq = interpolated + inv_extrapolation * extrapolation
    return inv_freq.astype(np.float32), attention_factor
