"""Names the generated code cannot use for ops, tensors, layers or the model.

Op names become attributes of an nn.Cell and locals of its construct, and layer
and model names become class names, so they must not shadow what the cells and
the module already use.
"""

from __future__ import annotations

import keyword
import re
from functools import cache

from msgen.ops import imported_names
from msgen.resources import resource_dir

# Public attributes of mindspore.nn.Cell (2.10); an op by one of these names
# would replace a method or flag of the cell.
CELL_ATTRIBUTES = frozenset("""
IGNORE_LIST T_destination add_flags add_flags_recursive apply arguments_key bprop_debug
buffers cast_inputs cell_init_args cell_type cells cells_and_names check_names
check_names_and_refresh_name cls_name compile compile_and_run compile_cache compile_phase
compiled construct create_time enable_backward_hook exist_names exist_objs extend_repr
generate_scope get_buffer get_extra_state get_flags get_func_graph_proto get_inputs
get_mixed_precision_type get_parameters get_scope get_sub_cell global_cells grad_ops_label
has_bprop init_parameters_data insert_child_to_cell insert_param_to_cell is_top_cell
jit_config_dict load_state_dict mixed_precision_type name_cells named_buffers offload
parallel_parameter_merge_net_dict parallel_parameter_name_list param_prefix
parameter_layout_dict parameters_and_names parameters_broadcast_dict parameters_dict phase
phase_cache pipeline_segment pipeline_stage recompute register_backward_hook
register_backward_pre_hook register_buffer register_forward_hook register_forward_pre_hook
register_load_state_dict_post_hook register_load_state_dict_pre_hook
register_parameter_forward_hook register_saved_tensors_hooks register_state_dict_post_hook
register_state_dict_pre_hook remove_redundant_parameters requires_grad run_construct
set_boost set_broadcast_flag set_comm_fusion set_data_parallel set_extra_state set_grad
set_inputs set_jit_config set_mixed_precision_type set_train shard state_dict to to_empty
to_float total_instance_count trainable_params training untrainable_params
update_cell_prefix update_cell_type update_parameters_name
""".split())

# The generated files' module-level names are read from the templates
# (template_names). The locals the generated methods use beside the op names are
# not module-level, so they are named here: construct's arguments, the loop
# variable of repeated layers and the running sum of auxiliary losses and its adder
# (msgen/emit/opcode.py), the fusion helper's table, and multi-token prediction's
# attribute and locals (msgen/emit/mtp.py).
MTP_NAMES = ("mtp", "mtp_ids", "mtp_labels", "mtp_hidden", "mtp_embedded", "mtp_normed",
             "mtp_losses", "depth")  # fmt: skip
CONSTRUCT_NAMES = frozenset({"self", "labels", "cell", "parameters", "aux", "add_aux",
                             *MTP_NAMES})  # fmt: skip
# mindspore.parallel.nn's micro-batch cells, (without, with) a pipeline: train.py
# imports the one its mode picks (msgen/emit/modes.py), a name no template spells
MICRO_CELLS = ("GradAccumulation", "Pipeline")
TEMPLATES = (
    "model.py.j2",
    "model/**/*.py.j2",
    "train.py.j2",
    "train/**/*.py.j2",
    "ops/**/*.py.j2",
)
# train/: train.py's fragments; ops/: the ops' helper cells

_QUOTED = re.compile(r"""["']([A-Za-z_][A-Za-z0-9_]*)(?:, )?["']""")
_LISTED = re.compile(r"""\[["']([A-Za-z_][A-Za-z0-9_]*)["']\]""")
_JINJA = re.compile(r"{{(.*?)}}")
_ASSIGNED = re.compile(r"(?:def|class) ([A-Za-z_]\w*)|([A-Za-z_]\w*)\s*(?::[^=]*)?=(?!=)")
# Only a line that starts with a name can bind one at module level.
_TOP_LEVEL = re.compile(r"[A-Za-z_]")


def _jinja_names(expr: str, sets: dict[str, str]) -> set[str]:
    """The names a `{{ ... }}` in an import line can write: the quoted names in it,
    or the names listed in the `{% set %}` of the variable it prints."""
    var = expr.split("|")[0].strip()
    return set(_QUOTED.findall(expr)) | set(_LISTED.findall(sets.get(var, "")))


def _bound(line: str, sets: dict[str, str]) -> set[str]:
    """The names a top-level line of a template binds in the generated module."""
    if line.startswith("import "):
        return {part.split(" as ")[-1].strip().split(".")[0] for part in line[7:].split(",")}
    if line.startswith("from ") and " import " in line:
        names = line.split(" import ", 1)[1]
        found = set().union(*(_jinja_names(e, sets) for e in _JINJA.findall(names)))
        plain = _JINJA.sub("", names).replace("(", "").replace(")", "")
        return found | {p.split(" as ")[-1].strip() for p in plain.split(",") if p.strip()}
    m = _ASSIGNED.match(line)
    return {m.group(1) or m.group(2)} if m else set()


@cache
def template_names() -> frozenset[str]:
    """Every name the generated model.py and train.py import or define at module
    level, read from the templates and model.py's declared imports, so a new import
    is reserved at once."""
    names: set[str] = set(imported_names()) | set(MICRO_CELLS)
    root = resource_dir("templates")
    for path in (path for pattern in TEMPLATES for path in sorted(root.glob(pattern))):
        text = path.read_text(encoding="utf-8")
        sets = dict(re.findall(r"{%-? set (\w+) = (.*?)-?%}", text))
        for line in filter(_TOP_LEVEL.match, text.splitlines()):
            names |= {n for n in _bound(line, sets) if n.isidentifier()}
    return frozenset(names)


def camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def reserved_reason(name: str) -> str | None:
    """Why `name` cannot name an op or tensor, or None when it can."""
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        return "it is a Python keyword"
    if name.startswith("_"):
        return "names starting with `_` are kept for the generated code"
    if name in CELL_ATTRIBUTES:
        return "it is an attribute of MindSpore's nn.Cell"
    if name in CONSTRUCT_NAMES or name in template_names():
        return "the generated code already uses it"
    return None


def class_clash(name: str) -> str | None:
    if camel(name) in template_names():
        return f"its class `{camel(name)}` would hide a name the generated code defines or imports"
    return reserved_reason(name)
