"""Every diagnostic code msgen can report, with what `msgen explain CODE` prints.

Ranges: MSL0xx syntax, MSL1xx names and shapes, MSL2xx sharding, MSL3xx topology
and pipeline, MSL4xx memory budget, MSL5xx training settings, MSL6xx the data
`msgen data` makes for a spec.
"""

from __future__ import annotations

CODES: dict[str, tuple[str, str]] = {
    # syntax
    "MSL001": (
        "syntax error",
        "The parser met a token it did not expect here. A statement ends at the end of its "
        "line; a bracketed list may span lines. The hint lists what would have been accepted.",
    ),
    "MSL002": (
        "unexpected character",
        "A character that no MSL token starts with, such as `$` or an unclosed string, or a "
        "carriage return not followed by a newline (anywhere, comments included: lines end "
        "in \\n or \\r\\n). Names are letters, digits and `_`; strings are in double "
        "quotes on one line; comments start with `#`.",
    ),
    "MSL003": (
        "unexpected end of file",
        "The file ended inside a block or a bracket. Close every `{` with `}` and every "
        "`(` or `[` with its pair.",
    ),
    "MSL004": (
        "unsupported version line",
        "The first line names the language version: `msl 0.1`. This msgen reads 0.1.",
    ),
    "MSL005": (
        "expression nested too deeply",
        "An expression nests more than 100 levels: brackets, calls and lists, plus one "
        "level per operator in a chain (`a + b + c` is two). Name parts of it as dims.",
    ),
    "MSL006": (
        "number out of range",
        "A number, or a value computed from numbers, is larger than a float can hold "
        "(about 1.8e308) or not finite. Every number msgen writes into code is finite.",
    ),
    # names and shapes
    "MSL101": (
        "unknown dim",
        "An expression uses a name that is not a dim of the model block. Dims are defined "
        "in `model NAME { ... }`; `batch` (= train.micro_batch * dp) is built in for shapes.",
    ),
    "MSL102": (
        "defined twice",
        "A dim, tensor, key, block, layer or fusion group is defined a second time. Each "
        "name is defined once; rename one of them or delete the duplicate.",
    ),
    "MSL103": (
        "unknown block",
        "A top-level block msgen does not know. Blocks: model, cluster, mesh, layer, network, "
        "recompute, pipeline, fusion, train, budget.",
    ),
    "MSL104": (
        "unknown key or statement",
        "A key that the block does not take, or a statement that does not belong in it "
        "(for example an `input` in the mesh block). docs/language.md lists every key.",
    ),
    "MSL105": (
        "missing required key",
        "A block lacks a key it needs: model needs vocab, hidden, heads, layers, seq; cluster "
        "needs device, per_node, nodes; mesh needs dp and tp; train needs micro_batch, "
        "global_batch, optimizer, schedule. A layer and the model need a name.",
    ),
    "MSL106": (
        "dim out of range",
        "Dims are positive integers below 2^40.",
    ),
    "MSL107": (
        "inexact division",
        "`/` between dims must divide exactly (`ffn = hidden * 8 / 3` usually does not). "
        "Use `//` to round down on purpose, or choose dims that divide.",
    ),
    "MSL108": (
        "wrong kind of value",
        "The value has the wrong form for its key: a dim needs an integer, device_memory a "
        'size with a unit (`58 GiB`), nodes a list of strings, data `mindrecord("path")` '
        'or `mindrecord("path", valid = "path")`.',
    ),
    "MSL110": (
        "unknown tensor",
        "An op uses a tensor name that is not defined in this layer or network. Each layer "
        "sees only its own input and the tensors defined in it.",
    ),
    "MSL111": (
        "used before definition",
        "A name is used on a line above the one that defines it. Statements run top to "
        "bottom; move the definition up.",
    ),
    "MSL112": (
        "unused tensor (warning)",
        "A tensor is computed but nothing consumes it and it is not the output. It still costs "
        "compute and memory; use it or delete the statement.",
    ),
    "MSL113": (
        "unknown op",
        "The op library has no op by that name. Ops: embedding, positions, linear, attention, "
        "layernorm, rmsnorm, gelu, silu, swiglu, dropout, cross_entropy, and `+`, `*`.",
    ),
    "MSL114": (
        "unknown layer",
        "`repeat` or `recompute` names a layer that no `layer NAME { ... }` block defines.",
    ),
    "MSL115": (
        "wrong arguments",
        "An op got too many positional arguments, an unknown keyword, the same argument twice, "
        "or lacks a required one; the optimizer or the schedule got the same argument twice; "
        "attention's `rope_scaling` form lacks a key its scaling needs or has one it does not "
        "know. docs/language.md gives each op's signature.",
    ),
    "MSL116": (
        "wrong kind of operand",
        "An op's operand is not what it takes: tensor operands are tensor names (write an "
        "inner op on its own line), flags are `true`/`false`, and only `+` and `*` apply to "
        "tensors. `repeat` belongs in the network and passes one tensor. attention's "
        "`rope_scaling` is `linear(...)`, `llama3(...)` or `yarn(...)`; `dynamic` and "
        "`longrope` are refused with their reason.",
    ),
    "MSL117": (
        "shape mismatch",
        "Operands do not fit together: `+` and `*` broadcast over trailing dims only, "
        "cross_entropy takes logits [..., vocab] over the tokens' shape, the network takes "
        "token ids [batch, seq] and ends in a scalar loss.",
    ),
    "MSL118": (
        "repeat shape mismatch",
        "A repeated layer must take the shape it is given and give the same shape back, so "
        "that copies can be chained.",
    ),
    "MSL119": (
        "op shape rule broken",
        "An op's own shape rule fails: attention needs qkv width (heads + 2 * kv_heads) * "
        "head_dim and heads a multiple of kv_heads; swiglu an even last dim; a tied output "
        "layer the table's transpose.",
    ),
    "MSL120": (
        "input or output missing or repeated",
        "A layer and the network each take exactly one `input` and end with one `output`.",
    ),
    "MSL121": (
        "layer repeated twice",
        "Parameter paths name the repeated layer (`decoder.3.qkv.weight`), so each layer is "
        "repeated by one `repeat`. Define a second layer block for a second stack.",
    ),
    "MSL122": (
        "missing block",
        "A spec needs model, cluster, mesh, network and train blocks.",
    ),
    "MSL123": (
        "bad tie",
        "`tie = NAME` must name an embedding op defined above in the same block; the output "
        "layer then uses its table transposed and owns no weight.",
    ),
    "MSL124": (
        "layer never used (warning)",
        "A layer block that no `repeat` in the network uses. It is checked but generates "
        "nothing.",
    ),
    "MSL125": (
        "reserved name",
        "An op, tensor, layer or model name that the generated code cannot use: a Python "
        "keyword, a name starting with `_`, an attribute of MindSpore's nn.Cell (`training`, "
        "`cells`, ...), a name the generated module uses (`labels`, `ops`, `nn`, ...), or a "
        "layer or model whose class name (`linear` -> `Linear`) is a generated helper class "
        "or another layer's class.",
    ),
    "MSL126": (
        "op argument out of range",
        "A number an op takes is outside the interval MindSpore accepts: dropout rates "
        "(`dropout(x, p)`, attention's `dropout`) are in [0, 1), norm `eps` is positive, "
        "`rope_scaling`'s values are positive (llama3: high_freq_factor > low_freq_factor).",
    ),
    "MSL127": (
        "unused dim that looks like a key (warning)",
        "A name in the `model` block that msgen does not read is a free dim, for use in "
        "shapes and op arguments. This one is used nowhere and is close to a key msgen "
        "does read (`kv_head` for `kv_heads`), so it is most likely a typo: the spec gets "
        "the key's default, or misses it. Rename it, or use or delete the dim.",
    ),
    # sharding
    "MSL201": (
        "split does not divide",
        "A mesh axis splits a dim (or the attention heads) into unequal parts. Every split "
        "dim must be divisible by the product of the axes splitting it; tp must divide heads, "
        "kv_heads, hidden, ffn and vocab where it splits them.",
    ),
    "MSL202": (
        "split has the wrong number of entries",
        "`@ [...]` gives one entry per dim of the tensor or parameter it applies to.",
    ),
    "MSL203": (
        "unknown mesh axis",
        "Split entries name mesh axes: `dp`, `tp`, a product such as `dp*tp`, or `1`.",
    ),
    "MSL204": (
        "axis used twice in one tensor",
        "One mesh axis can split at most one dim of a tensor.",
    ),
    "MSL205": (
        "pp splits a tensor",
        "`pp` is the number of pipeline stages; it splits the repeated layers, not tensors.",
    ),
    "MSL206": (
        "inconsistent reduction split",
        "A linear's input last dim and its weight's input dim are split over different axes, "
        "so the matmul's partial sums would not line up. Split both over the same axis (row "
        "parallel) or leave one whole.",
    ),
    "MSL208": (
        "implicit redistribution (warning)",
        "A consumer needs a tensor split differently from how its producer splits it, so "
        "MindSpore inserts communication in front of the consumer. The message gives the "
        "bytes moved per device per step. Declare the split where the tensor is produced if "
        "this is not what you meant.",
    ),
    "MSL209": (
        "unknown parameter in a split",
        "`NAME @ [...]` names a parameter the op does not have (linear: weight, bias; "
        "embedding, positions: table; layernorm: gamma, beta; rmsnorm: gamma).",
    ),
    "MSL210": (
        "invalid split",
        "A split entry is not a mesh axis, a product of axes, or `1`, or it splits a dim the "
        "op needs whole (norm weights, a moe router), or it names `ep` anywhere but the "
        "experts' dim (the first) of a moe op's stacked experts: the generated code splits "
        "only that dim over ep. A split declared on a moe op's stacked experts must be the "
        "one the generated code runs (with a capacity the experts over ep and the ffn dim "
        "over tp; dropless the experts over ep, each whole): the message names it.",
    ),
    "MSL211": (
        "ep does not divide dp",
        "The expert-parallel axis is carved out of dp (Megatron-LM's expert data "
        "parallelism): the dp ranks form dp / ep groups of ep ranks that share the experts "
        "between them, so ep must divide dp. It adds no devices: dp * tp * pp still covers "
        "the cluster.",
    ),
    "MSL212": (
        "ep does not divide the experts",
        "Each expert-parallel rank holds experts / ep whole experts (the stacked experts' "
        "first dim is split over ep), so ep must divide a moe op's `experts`.",
    ),
    # topology and pipeline
    "MSL301": (
        "mesh does not match the devices",
        "dp * tp * pp must equal the devices the cluster lists: len(nodes) × per_node. Every "
        "device runs one rank, and MindSpore needs the mesh to cover them exactly. The hint "
        "lists meshes that fit, with tp inside a server and dividing the heads, and pp no "
        "more than the repeated layers; changing dp alone is listed first when it fits.",
    ),
    "MSL302": (
        "bad per_node",
        "per_node is the number of NPUs each server uses: 1, 2, 4 or 8 (an Atlas 800T A2 has "
        "8), the same on every node, as Ascend rank tables expect.",
    ),
    "MSL303": (
        "tensor-parallel group spans nodes",
        "Ranks put tp innermost (rank = (stage * dp + dp_i) * tp + tp_i) and nodes take "
        "consecutive ranks, so a tp group stays inside one server only when tp divides "
        "per_node. Tensor parallelism communicates in every layer and needs the fast links "
        "inside a server: lower tp and raise dp or pp.",
    ),
    "MSL304": (
        "invalid node address",
        "Each entry of `nodes` becomes a server_id in the rank table, which must be the "
        "server's IPv4 address (`ip -4 addr`), not a host name; the first is also msrun's "
        "master address. Unspecified (0.0.0.0), multicast and reserved addresses are refused.",
    ),
    "MSL305": (
        "duplicate node address",
        "Each server appears once in `nodes`, in rank order; listing one twice would give two "
        "sets of ranks the same server_id.",
    ),
    "MSL306": (
        "invalid device IP",
        "Device IPs are the NPUs' own RoCE IPv4 addresses, read with `hccn_tool -i N -ip -g` "
        "or from /etc/hccn.conf `address_N=IP` on each server. Fix the address in the list or "
        "in the hccn.conf the message names.",
    ),
    "MSL307": (
        "duplicate device IP",
        "Every device IP in the cluster is distinct, and none is a node's own address. A "
        "common cause is giving two nodes the same hccn.conf: each server has its own.",
    ),
    "MSL308": (
        "wrong number of device IPs",
        'device_ips has one entry per node, in the order of `nodes` (`hccn("path")` alone is '
        "fine for one node), and each entry holds exactly per_node addresses, device 0 first. "
        "An hccn.conf lists every NPU of its server; when per_node is lower, write the used "
        "devices' IPs as a list.",
    ),
    "MSL309": (
        "unreadable hccn.conf",
        '`hccn("path")` reads /etc/hccn.conf lines `address_N=IP`, relative to the spec\'s '
        "folder, numbered 0..N-1.",
    ),
    "MSL310": (
        "unknown device",
        "The device is not in msgen's catalogue (ascend910b, ascend910b3, ascend910b4, "
        "ascend910a, a100_80g, h100_80g).",
    ),
    "MSL311": (
        "pipeline split does not add up",
        "`split` lists the repeated layers per pipeline stage; the counts must sum to the "
        "layers the network repeats (the sum of its `repeat` counts). Leave `split` out for a "
        "balanced split.",
    ),
    "MSL312": (
        "empty pipeline stage",
        "Every pipeline stage needs at least one repeated layer: pp may not exceed the layers "
        "the network repeats, and no `split` entry may be 0 or negative.",
    ),
    "MSL313": (
        "too few micro-batches",
        "A pipeline of pp stages needs at least pp micro-batches per step, or stages sit "
        "idle for most of the step. micro_batches is pipeline.micro_batches, or global_batch "
        "/ (micro_batch * dp) when it is not given: raise it (and global_batch to match) or "
        "use fewer stages.",
    ),
    "MSL314": (
        "split length differs from pp",
        "`split` gives one layer count per pipeline stage, so it has pp entries.",
    ),
    "MSL315": (
        "bad pipeline schedule",
        "Schedules: 1f1b, gpipe, interleaved(chunks = N). An interleaved schedule gives each "
        "stage N chunks of equal size, so the repeated layers must be divisible by pp * "
        "chunks unless `split` is given; with `split`, each stage's count is divided over "
        "its N chunks, so every count must be at least N.",
    ),
    "MSL316": (
        "bad master port",
        "cluster.master_port is the TCP port of msrun's scheduler on nodes[0]: 1..65535 "
        "(default 8118), free on that node.",
    ),
    # memory
    "MSL401": (
        "over the memory budget",
        "A pipeline stage's estimated peak memory per device exceeds the budget "
        "(budget.device_memory, or the device's memory minus its runtime reserve). The "
        "message gives the stage's breakdown and up to three changes that would make every "
        "stage fit (recompute, zero, smaller micro-batches, another schedule or mesh), each "
        "with its effect estimated on the changed spec and the `--set` arguments that try it: "
        "`msgen estimate SPEC --set ...` shows the whole estimate.",
    ),
    "MSL402": (
        "little headroom (warning)",
        "The total fits, but not with the 10% fragmentation headroom on top: MindSpore's peak "
        "with fragments is usually about 10% above the used peak, so a run this close to the "
        "budget may still run out of memory. `msgen estimate` shows where the memory goes.",
    ),
    "MSL403": (
        "budget beyond the device",
        "budget.device_memory is more than the device can give: its HBM less the runtime "
        "reserve in msgen's device catalogue (what the CANN runtime holds before training "
        "allocates anything). A fit against such a budget would promise memory that is not "
        "there; lower device_memory, or leave it out to budget what the device can give.",
    ),
    # training
    "MSL501": (
        "batch arithmetic",
        "global_batch must equal micro_batch * dp * micro_batches when pipeline.micro_batches "
        "is given; without it, micro_batches is global_batch / (micro_batch * dp), which must "
        "divide exactly. Change global_batch or micro_batches as the hint says.",
    ),
    "MSL502": (
        "warmup not shorter than the schedule",
        "The learning-rate warmup must end before the schedule's last step: warmup < steps. A "
        "warmup of a few percent of the steps is usual.",
    ),
    "MSL503": (
        "bad zero level",
        "zero is 0 (off), 1 (shard optimizer states over dp), 2 (and gradients) or 3 (and "
        "weights).",
    ),
    "MSL504": (
        "unknown optimizer or argument",
        "The optimizer is adamw(lr, beta1, beta2, eps, weight_decay); lr is required, the "
        "others default to 0.9, 0.999, 1e-8 and 0.",
    ),
    "MSL505": (
        "setting out of range",
        "An optimizer, schedule or training value is outside its valid range: lr > 0, 0 <= "
        "beta1, beta2 < 1, eps > 0, weight_decay >= 0; warmup a whole number >= 0, steps a "
        "whole number > 0, 0 <= min_lr <= lr; seed in 0 .. 2^32 - 1.",
    ),
    "MSL506": (
        "unknown schedule or argument",
        "The learning-rate schedule is cosine(warmup, steps, min_lr) (steps required, warmup "
        "and min_lr default to 0) or constant(warmup).",
    ),
    "MSL507": (
        "fusion group does not do what it says (warning)",
        "A fusion group's pattern matches no parameter, so it does nothing. Patterns are "
        "fnmatch globs, case-sensitive, over parameter paths: the repeated layer, the copy "
        "index, the op and the parameter (`decoder.3.qkv.weight`, `decoder.0.ln1.gamma`), or "
        "a network op and its parameter (`emb.table`, `norm.gamma`). A tied output layer has "
        "no weight of its own.\n\n"
        "Or a group is `allgather` or `reducescatter`: MindSpore keeps one fusion id per "
        "parameter, carried by every collective of that parameter (its gradient AllReduce; "
        "with zero >= 1 the parallel optimizer's AllGather and ReduceScatter), so the kind "
        "cannot narrow what the group fuses. With zero = 0 there is no AllGather or "
        "ReduceScatter of parameters at all: the group fuses gradient AllReduces, like an "
        "`allreduce` group. Write `allreduce` to say what happens.",
    ),
    "MSL508": (
        "unknown dtype",
        "dtypes are fp32, fp16 and bf16.",
    ),
    "MSL509": (
        "bad recompute",
        "recompute takes `LAYER = full`, `none` or `select(op, ...)` naming ops of the layer.",
    ),
    "MSL510": (
        "bad checkpoint setting",
        "checkpoint is `every N keep M` (N steps between saves, M kept) or `none`.",
    ),
    "MSL511": (
        "too many fusion buckets",
        "`buckets N` splits a group's repeated-layer parameters into N contiguous layer "
        "ranges, so N may not exceed the layers the network repeats.",
    ),
    "MSL512": (
        "bad loss scale or gradient clip",
        "loss_scale is `dynamic`, `none` or a positive number; grad_clip is a positive number "
        "(the global gradient norm it clips to) or `none`.",
    ),
    "MSL513": (
        "evaluation without a validation set",
        "`eval_every = N` runs the validation set every N steps, so the data must name one: "
        '`data = mindrecord("train.mindrecord", valid = "valid.mindrecord")` (`msgen data '
        "--valid 0.01` writes both). With a validation set and no eval_every, it is 1000.",
    ),
    "MSL514": (
        "evaluation under a pipeline",
        "train.py's validation runs the network forward only. With pp > 1 that would be the "
        "training pipeline without its backward pass, and MindSpore's pipeline pass labels "
        "micro-batches only in training graphs; MindSpore's Model and mindformers evaluate "
        "the bare network instead, a path not yet shown to work here. Remove `valid` and "
        "eval_every, or train with pp = 1.",
    ),
    "MSL530": (
        "bad multi-token prediction setting",
        "`mtp = mtp(depth = D, weight = w, layer = NAME)` in `train` adds D modules that "
        "predict the tokens 2 .. D + 1 ahead (DeepSeek-V3's multi-token prediction). depth "
        "is a whole number from 1 to seq - 1, weight a number >= 0 (the loss adds w / D "
        "times the modules' summed losses), layer a layer the network repeats (default: the "
        "last one repeated). `mtp = none` turns it off.",
    ),
    "MSL531": (
        "network unfit for multi-token prediction",
        "The modules share the main model's embedding table and output layer, and take h^0 "
        "from the final norm. The network must end with `norm = layernorm(...)` or "
        "`rmsnorm(...)`, `logits = linear(norm, vocab, bias = false)` or `tie = emb`, and "
        "`output cross_entropy(logits, tokens)`, with `emb = embedding(tokens, ...)` of its "
        "input.",
    ),
    # data
    "MSL601": (
        "tokenizer does not fit the vocabulary",
        "Every token id must be below the model's `vocab`, or the embedding lookup reads "
        "past its table. A tokenizer with fewer ids is fine (GPT-2's 50,257 under a padded "
        "50,304); one with more needs a larger `vocab`. `--train-tokenizer` learns a "
        "byte-level BPE of exactly `vocab` ids, which needs room for the 256 bytes and EOS.",
    ),
    "MSL602": (
        "too little data",
        "train.py reads whole global batches of `seq + 1`-token windows, so the training set, "
        "and the validation set when there is one, must make at least `global_batch` windows. "
        "Add text, give the validation set a larger `--valid` fraction, or lower `seq` or "
        "`global_batch`.",
    ),
    "MSL603": (
        "document skipped",
        "`msgen data` skips a document it cannot use and goes on: invalid UTF-8 (the byte "
        "offset is given), a JSON Lines line that is not JSON or has no string `--field`, "
        "a record longer than 16 MiB, a document empty after normalisation. The first ten "
        "are shown; dataset.json counts all of them by reason.",
    ),
}


def explain(code: str) -> str | None:
    entry = CODES.get(code.upper())
    if entry is None:
        return None
    title, body = entry
    return f"{code.upper()}: {title}\n\n{body}\n"


def listing() -> str:
    """Every code with its title, one a line: what `msgen explain --list` prints."""
    return "".join(f"{code}  {title}\n" for code, (title, _) in CODES.items())
