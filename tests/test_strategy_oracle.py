"""The shard strategies gpt7b and llama13b record, against Megatron-LM's tensor parallelism.

The table below is written from Megatron-LM's definitions (Shoeybi et al. 2019, and
megatron/core/tensor_parallel/layers.py), not from msgen's op modules or plan.json:
the qkv and MLP-up (and gate) projections are column-parallel (weight `[in, out]` split
over tp on `out`, the input whole), the attention output and MLP-down projections are
row-parallel (weight split over tp on `in`, the input split on its last dim), attention
splits its heads over tp, the embedding and the logits are vocab-parallel (the table's
vocab dim split over tp), and everything splits its batch over dp. Each entry is the
`in_strategy` one primitive of a block must carry, as a function of the mesh; the
instantiated networks must carry exactly these.
"""

from __future__ import annotations

import pytest

from tests.emit_fixtures import compiled, load, network_class, plan_json


def column(dp, tp):  # Y = X W, W [in, out] split on out; X [b*s, in] whole but for its batch
    return ((dp, 1), (1, tp))


def row(dp, tp):  # W split on in; X split on its last dim, the partial sums reduced
    return ((dp, tp), (tp, 1))


def heads(dp, tp):  # [batch, heads, ., .]: batch over dp, heads over tp
    return (dp, tp, 1, 1)


def attention(dp, tp):
    return {
        "qk": (heads(dp, tp), heads(dp, tp)),
        "pv": (heads(dp, tp), heads(dp, tp)),
        "softmax": (heads(dp, tp),),
    }


def common(dp, tp):
    """Vocab-parallel embedding (table [vocab, hidden] split on vocab; token ids split by
    batch) and the vocab-parallel softmax of the cross entropy."""
    return {
        ("emb", "gather"): ((tp, 1), (dp, 1)),
        ("output", "max"): ((dp, tp),),
        ("output", "sum"): ((dp, tp),),
    }


def gpt_network(dp, tp):
    # the logits use the embedding table [vocab, hidden], transposed: its vocab dim split
    return {**common(dp, tp), ("logits", "matmul"): ((dp, 1), (tp, 1))}


def llama_network(dp, tp):
    # an output layer of its own: column-parallel over the vocab
    return {**common(dp, tp), ("logits", "matmul"): column(dp, tp)}


def gpt_block(dp, tp):
    return {
        ("ln1", "norm"): ((dp, 1, 1), (1,), (1,)),
        ("qkv", "matmul"): column(dp, tp),
        ("qkv", "add"): ((dp, tp), (tp,)),  # a column-parallel bias is split with its columns
        **{("att", k): v for k, v in attention(dp, tp).items()},
        ("proj", "matmul"): row(dp, tp),
        ("proj", "add"): ((dp, 1), (1,)),  # a row-parallel bias is added after the reduce
        ("ln2", "norm"): ((dp, 1, 1), (1,), (1,)),
        ("up", "matmul"): column(dp, tp),
        ("up", "add"): ((dp, tp), (tp,)),
        ("act", "erf"): ((dp, 1, tp),),  # GeLU on the column-parallel activations
        ("down", "matmul"): row(dp, tp),
        ("down", "add"): ((dp, 1), (1,)),
    }


def llama_block(dp, tp):
    return {
        ("n1", "scale"): ((dp, 1, 1), (1,)),
        ("qkv", "matmul"): column(dp, tp),
        **{("att", k): v for k, v in attention(dp, tp).items()},
        ("o", "matmul"): row(dp, tp),
        ("n2", "scale"): ((dp, 1, 1), (1,)),
        ("gate", "matmul"): column(dp, tp),
        ("up", "matmul"): column(dp, tp),
        # SwiGLU on the column-parallel activations (primitives of the layer cell itself)
        ("act", None): ((dp, 1, tp),),
        ("mlp", None): ((dp, 1, tp), (dp, 1, tp)),
        ("down", "matmul"): row(dp, tp),
    }


ORACLE = {"gpt7b": (gpt_block, gpt_network), "llama13b": (llama_block, llama_network)}


def recorded(name: str) -> dict[tuple[str, str, str], tuple]:
    """(cell path, op, primitive) -> in_strategy, for every primitive with a strategy."""
    from mindspore.nn.utils import no_init_parameters

    with no_init_parameters():
        network = network_class(load(compiled(name), "model"), plan_json(name))()
    out = {}
    for path, cell in network.cells_and_names():
        for attr, prim in cell._primitives.items():
            if prim is not None and "in_strategy" in prim.attrs:
                out[(path, attr)] = tuple(tuple(s) for s in prim.attrs["in_strategy"])
    return out


@pytest.mark.parametrize("name", sorted(ORACLE))
def test_the_strategies_are_megatrons(name):
    mesh = plan_json(name)["mesh"]
    dp, tp = mesh["dp"], mesh["tp"]
    block, network = (table(dp, tp) for table in ORACLE[name])
    found = recorded(name)
    checked = {}
    for (path, attr), strategy in found.items():
        parts = path.split(".")
        # decoder.<copy>.<op>: an op's cell; decoder.<copy>: the layer's own primitives
        key = (parts[-1], attr) if len(parts) != 2 else (attr, None)
        wanted = block.get(key) if len(parts) in (2, 3) else network.get(key)
        if wanted is not None:
            assert strategy == wanted, f"{name} {path}.{attr}: {strategy}, Megatron {wanted}"
            checked.setdefault(key, 0)
            checked[key] += 1
    (layer,) = plan_json(name)["layers"].values()
    assert {k: v for k, v in checked.items() if k in block} == {k: layer["count"] for k in block}
    assert set(checked) >= set(network)
