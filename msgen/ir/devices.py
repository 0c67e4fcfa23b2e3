"""The device catalogue: memory, the runtime's share of it, compute, memory
bandwidth, the links between devices, and the time model's calibration.

Every figure says where it comes from. Three kinds: a vendor datasheet
("datasheet"), a published third-party measurement ("measured"), and a value
fitted so that the step-time model reproduces published training runs ("fitted",
with the runs named: specs/validation/published.json's runs marked `fit`, by
msgen.estimate.calibration; bench/calibrate.py prints the fit, and a test reruns it
against these values). The runs marked `check` there are not fitted on: they
check the model. Values no source pins down are marked "assumed"; the time
model's documentation lists them as its limits.

The reserve is what the runtime holds before training allocates anything (on a
64 GiB 910B it leaves the 58 GiB MindSpore Transformers recommends as
`max_device_memory`).
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 2**30
GB = 1e9
US = 1e-6


@dataclass(frozen=True)
class Link:
    """One network tier as collectives see it, per device.

    `bandwidth` is what one device can send in one direction. On a switched
    fabric (NVSwitch, a RoCE or InfiniBand network) a group of any size gets all
    of it; in a full mesh (Ascend's HCCS inside a server) each pair of devices has
    its own link of `bandwidth`, so a group of n devices drives n - 1 of them."""

    bandwidth: float  # bytes/s per device, one direction
    latency: float  # s per step of a ring collective
    efficiency: float  # the share of `bandwidth` collectives achieve (bus bandwidth)
    full_mesh: bool = False

    def bus_bandwidth(self, group: int) -> float:
        links = group - 1 if self.full_mesh else 1
        return self.bandwidth * self.efficiency * max(1, links)


@dataclass(frozen=True)
class Calibration:
    """The time model's parameters for a device and its software stack."""

    matmul_efficiency: float  # the share of peak FLOP/s large matmuls sustain in training
    memory_efficiency: float  # the share of HBM bandwidth memory-bound kernels sustain
    tp_overlap: float  # the share of tensor/sequence-parallel collectives hidden by matmuls
    dp_overlap: float  # the share of the gradient reduction hidden behind the last backward
    kernel_overhead: float  # s per kernel: launch and tail; makes small ops less efficient


@dataclass(frozen=True)
class Device:
    """An accelerator of the catalogue: memory, compute, links and calibration."""

    name: str
    hbm_bytes: int
    reserve_bytes: int  # runtime reserve: the CANN runtime, or the CUDA context
    matmul_flops: dict[str, float]  # dense matrix FLOP/s per compute dtype
    vector_flops: float  # fp32 FLOP/s of the vector (non-matrix) units
    hbm_bandwidth: float  # bytes/s
    intra: Link  # between devices of one node
    inter: Link  # between nodes
    calibration: Calibration
    target: str  # MindSpore's device_target for it: what a run on it records in run.json

    @property
    def usable_bytes(self) -> int:
        return self.hbm_bytes - self.reserve_bytes

    @property
    def peak_flops(self) -> float:
        """Dense fp16/bf16 matrix FLOP/s: what MFU and HFU divide by."""
        return self.matmul_flops["bf16"]


# Ascend 910B (Atlas 800T A2, 910B1/B2). No official datasheet is citable here.
# 354 TFLOP/s: 24 AI cores x 1.8 GHz x 8192 fp16 FLOP per cycle per core (the cube
# unit's 16x16x16 MACs); measured bf16 matmul: 328 TFLOP/s, fp32 87 TFLOP/s
# (github gameofdimension/limulidae). HBM2e: 1.6 TB/s is the figure commonly
# quoted (assumed). HCCS: a full mesh inside the server; limulidae measures 8-card
# all-reduce and all-gather at 126 and 130 GB/s of bus bandwidth, 18 GB/s per
# peer link (2 cards: all-reduce 18, all-gather 38 GB/s algorithm bandwidth = 18
# and 19 bus). Between servers: one 200 GbE RoCE port per NPU (25 GB/s).
# efficiency 0.33: limulidae's 18.5 GB/s per peer link of HCCS's 56; latencies assumed
ASCEND_HCCS = Link(bandwidth=56 * GB, latency=10 * US, efficiency=0.33, full_mesh=True)
ASCEND_ROCE = Link(bandwidth=25 * GB, latency=15 * US, efficiency=0.8)  # efficiency assumed
# Fitted on MindSpeed-LLM's LLaMA2 runs on Atlas 900 A2 PODc (specs/validation/):
# the 7B run (tp 1, pp 2, dp 4; 4,241 tokens/s per NPU) fixes matmul_efficiency,
# the 13B run (tp 8 with sequence parallelism; 1,990 tokens/s per NPU; its script
# examples/mcore/llama2/pretrain_llama2_13b_ptd.sh asks for the fused RMSNorm, SwiGLU
# and rope and flash attention, and no MC2) fixes tp_overlap: two parameters, two
# runs, so both are met by construction. Each run is priced with the kernels its
# source ran (published.json's `kernels`, msgen/estimate/kernels.py).
# Checked on MindFormers' LLaMA2-7B and 13B runs on Atlas 800T A2 (dp 8; not fitted).
# memory_efficiency, dp_overlap, kernel_overhead: assumed.
ASCEND_CANN = Calibration(
    matmul_efficiency=0.595,  # fitted
    memory_efficiency=0.7,
    tp_overlap=0.515,  # fitted
    dp_overlap=0.5,
    kernel_overhead=10 * US,
)

# A100 SXM4 80GB (NVIDIA A100 datasheet): 312 TFLOP/s fp16/bf16 dense, 156 TF32,
# 19.5 fp32; 2,039 GB/s HBM2e; NVLink 3 through NVSwitch: 300 GB/s per direction
# per GPU; DGX A100: 8 x 200 Gb/s HDR InfiniBand per node, 25 GB/s per GPU.
# Fitted on Korthikanti et al. 2022 (Megatron-LM), Table 4's ten per-layer times
# of the 22B model (specs/validation/korthikanti22b*.msl): matmul_efficiency,
# memory_efficiency and the NVLink efficiency; Table 5's two end-to-end times are
# held out as the check. tp_overlap = 0: that Megatron hid no forward tp
# collective (backward's overlap with the weight gradient is the model's own rule).
# dp_overlap and kernel_overhead: assumed.
MEGATRON_A100 = Calibration(
    matmul_efficiency=0.73,  # fitted
    memory_efficiency=0.82,  # fitted
    tp_overlap=0.0,
    dp_overlap=0.5,
    kernel_overhead=5 * US,
)

# H100 SXM5 80GB (NVIDIA H100 datasheet): 989 TFLOP/s bf16 dense, 494.5 TF32, 67
# fp32; 3,350 GB/s HBM3; NVLink 4: 450 GB/s per direction per GPU; DGX H100:
# 8 x 400 Gb/s NDR InfiniBand per node, 50 GB/s per GPU. Not fitted on a
# published run: A100's efficiencies (assumed).
A100_NVLINK = Link(bandwidth=300 * GB, latency=5 * US, efficiency=0.91)  # fitted
H100_NVLINK = Link(bandwidth=450 * GB, latency=5 * US, efficiency=0.91)  # A100's (assumed)
HDR_IB = Link(bandwidth=25 * GB, latency=10 * US, efficiency=0.8)  # efficiency assumed
NDR_IB = Link(bandwidth=50 * GB, latency=10 * US, efficiency=0.8)  # efficiency assumed


def ascend(name: str, hbm: int, reserve: int, bf16: float, fp32: float, hbm_bw: float, intra):
    return Device(
        name,
        hbm,
        reserve,
        {"bf16": bf16, "fp16": bf16, "fp32": fp32},
        fp32,
        hbm_bw,
        intra,
        ASCEND_ROCE,
        ASCEND_CANN,
        "Ascend",
    )


# 910B3 / 910B4: fewer AI cores (20 at 1.8 GHz: ~295; 20 at 1.5 GHz: ~246, assumed
# from the 910B's per-core rate) and, on the B4, 32 GiB of HBM at about half the
# bandwidth (assumed). 910A: 256 TFLOP/s fp16 (Huawei's Ascend 910 announcement),
# HCCS 3 x 30 GB/s, 2 x 100 GbE RoCE; its fp32 and HBM (1.2 TB/s) assumed.
# Their calibration is the 910B's (assumed).
DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        ascend("ascend910b", 64 * GiB, 6 * GiB, 354e12, 87e12, 1.6e12, ASCEND_HCCS),
        ascend("ascend910b3", 64 * GiB, 6 * GiB, 295e12, 73e12, 1.6e12, ASCEND_HCCS),
        ascend("ascend910b4", 32 * GiB, 3 * GiB, 246e12, 61e12, 0.8e12, ASCEND_HCCS),
        ascend(
            "ascend910a",
            32 * GiB,
            3 * GiB,
            256e12,
            64e12,
            1.2e12,
            Link(bandwidth=90 * GB, latency=10 * US, efficiency=0.5),  # efficiency assumed
        ),
        Device(
            "a100_80g",
            80 * GiB,
            1 * GiB,  # the CUDA context
            {"bf16": 312e12, "fp16": 312e12, "fp32": 156e12},  # fp32 matmuls run as TF32
            19.5e12,
            2.039e12,
            A100_NVLINK,
            HDR_IB,
            MEGATRON_A100,
            "GPU",
        ),
        Device(
            "h100_80g",
            80 * GiB,
            1 * GiB,
            {"bf16": 989e12, "fp16": 989e12, "fp32": 494.5e12},
            67e12,
            3.35e12,
            H100_NVLINK,
            NDR_IB,
            MEGATRON_A100,
            "GPU",
        ),
    )
}
