"""Several nodes: the shell lines launch.sh and torchrun.sh share to take their node's place
in a job of N nodes (from arguments or a scheduler's variables, checked), and to choose
the interface the node's ranks talk over.

One node stays what it was: launch.sh's ranks start themselves over loopback. On N nodes
each node runs torchrun (c10d rendezvous at node 0), with the tuned layout of one node.
"""
from __future__ import annotations

import shlex

# Option -> (shell variable, environment variable a scheduler or the user may set instead).
OPTIONS = {
    "--nnodes": ("nnodes", "NNODES"),
    "--node-rank": ("node_rank", "NODE_RANK"),
    "--rdzv-endpoint": ("endpoint", "RDZV_ENDPOINT"),
    "--iface": ("iface", "TUNED_IFACE"),
    "--max-restarts": ("max_restarts", "MAX_RESTARTS"),
}
# autotune/runtime/nodes.py as the output folder holds it (outputs.RUNTIME_NAME)
HELPER = "tuned_runtime/nodes.py"
# Variables that put the ranks on a network interface: loopback on one node.
INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
BAD_NODES = "--nnodes must be a positive integer, not $nnodes"
BAD_RANK = "--node-rank must be an integer from 0 to $((nnodes - 1)), not $node_rank"
BAD_ENDPOINT = "--rdzv-endpoint must be HOST:PORT, not $endpoint"
NO_ENDPOINT = ("--rdzv-endpoint HOST:PORT is needed with --nnodes $nnodes: node 0's address and a free "
               "port, the same on every node")
STORE_NOTE = ("torchrun's TCP stores (the rendezvous on node 0; the ranks' own store on the node of "
              "rank 0) listen on every interface of their node, whatever the interface above: torch "
              "offers no way to bind them to one. Keep the nodes on a network you trust.")


def usage_lines(script: str, *, restarts: bool) -> list[str]:
    """The header comment that says how to run ``script`` on several nodes."""
    restart = " [--max-restarts K]" if restarts else ""
    restart_env = ", MAX_RESTARTS" if restarts else ""
    return [
        f"# Several nodes: on each, {script} --nnodes N --node-rank R --rdzv-endpoint HOST:PORT [--iface NAME]"
        f"{restart} ...",
        f"#   (or NNODES, NODE_RANK, RDZV_ENDPOINT, TUNED_IFACE{restart_env}; under srun the nodes default to",
        "#   SLURM_STEP_NUM_NODES and the rank to SLURM_NODEID). HOST:PORT is node 0's address and a free",
        "#   port, the same on every node; node 0 hosts the rendezvous. The ranks talk over --iface, by",
        "#   default the interface through which HOST is reached. Each node runs the tuned layout: the",
        "#   global batch is N x the tuned one.",
    ]


def _spellings(option: str) -> list[str]:
    """``--node-rank`` and ``--node_rank``: torchrun takes both."""
    underscored = "--" + option[2:].replace("-", "_")
    return [option] if underscored == option else [option, underscored]


def _fail(script: str, message: str) -> str:
    return f'echo "{script}: {message}" >&2; exit 2'


def parse_lines(script: str, *, restarts: bool, keep_double_dash: bool,
                unused_on_one_node: tuple[str, ...] = ("--rdzv-endpoint", "--iface")) -> list[str]:
    """Read the node options out of the arguments (the others stay, in order; ``--`` ends
    them, and is kept for torchrun.sh, where it separates torchrun's flags) and check them.
    Sets nnodes, node_rank, endpoint, host, port, iface (and max_restarts); on one node,
    ``unused_on_one_node`` given are said to be unused."""
    options = {k: v for k, v in OPTIONS.items() if restarts or k != "--max-restarts"}
    names = [name for option in options for name in _spellings(option)]
    flat = "|".join(names)
    with_value = "|".join(f"{n}=*" for n in names)
    defaults = " ".join(f'{var}="${{{env}:-}}"' for var, env in options.values())
    # rank_given: a rank from the command line, not from the environment (see below)
    assign = [f'    {"|".join(_spellings(option))}) {var}="$value"{"; rank_given=1" if var == "node_rank" else ""} ;;'
              for option, (var, _) in options.items()]
    lines = [
        defaults,
        # srun runs one task per node, and says which node it is; the batch script itself
        # (where SLURM_NNODES is set too) is no node of the job: only srun's step counts.
        'if [ -n "${SLURM_STEP_NUM_NODES:-}" ]; then nnodes="${nnodes:-$SLURM_STEP_NUM_NODES}"; '
        'node_rank="${node_rank:-${SLURM_NODEID:-}}"; fi',
        'rest=(); rank_given=""',
        'while [ "$#" -gt 0 ]; do',
        '  case "$1" in',
        f'    {flat}) if [ "$#" -lt 2 ]; then {_fail(script, "$1 needs a value")}; fi; '
        'option="$1"; value="$2"; shift 2 ;;',
        f'    {with_value}) option="${{1%%=*}}"; value="${{1#*=}}"; shift ;;',
        f"    --) {'' if keep_double_dash else 'shift; '}break ;;",
        '    *) rest+=("$1"); shift; continue ;;',
        "  esac",
        '  case "$option" in',
        *assign,
        "  esac",
        "done",
        'set -- ${rest[@]+"${rest[@]}"} "$@"',
        'nnodes="${nnodes:-1}"',
        # NODE_RANK left by another launcher (Lightning reads it), or a one-node srun step
        # on the job's fourth node (SLURM_NODEID 3), says nothing about a job of one node.
        'if [ "$nnodes" = 1 ] && [ -z "$rank_given" ]; then node_rank=0; fi',
        'node_rank="${node_rank:-0}"',
        f'case "$nnodes" in ""|*[!0-9]*|0*) {_fail(script, BAD_NODES)} ;; esac',
        'case "$node_rank" in ""|*[!0-9]*|0?*) bad_rank=1 ;; *) bad_rank=$(( node_rank >= nnodes )) ;; esac',
        f'if [ "$bad_rank" = 1 ]; then {_fail(script, BAD_RANK)}; fi',
    ]
    if restarts:
        lines.append('max_restarts="${max_restarts:-0}"')
        lines.append(f'case "$max_restarts" in ""|*[!0-9]*) '
                     f'{_fail(script, "--max-restarts must be a non-negative integer, not $max_restarts")} ;; esac')
    unused_values = "".join(f"${OPTIONS[o][0]}" for o in unused_on_one_node)
    unused_names = " and ".join(unused_on_one_node)
    lines += [
        'host="${endpoint%:*}"; port="${endpoint##*:}"',
        'if [ "$nnodes" -gt 1 ]; then',
        f'  if [ -z "$endpoint" ]; then {_fail(script, NO_ENDPOINT)}; fi',
        '  case "$port" in ""|*[!0-9]*) bad_port=1 ;; *) bad_port=$(( port < 1 || port > 65535 )) ;; esac',
        f'  if [ "$bad_port" = 1 ] || [ -z "$host" ] || [ "$host" = "$endpoint" ]; then '
        f'{_fail(script, BAD_ENDPOINT)}; fi',
        f'elif [ -n "{unused_values}" ]; then',
        f'  echo "{script}: one node: {unused_names} not used (its ranks talk over loopback)" >&2',
        "fi",
    ]
    return lines


def _keep_or_set(key: str, script: str) -> str:
    """As shell.keep_or_export, for the interface chosen at run time (``$iface``)."""
    return (f'if [ -n "${{{key}+x}}" ] && [ "${{{key}}}" != "$iface" ]; then '
            f'echo "{script}: keeping your {key}=${{{key}}} (chosen: $iface)" >&2; '
            f'else export {key}="$iface"; fi')


def interface_lines(script: str, *, cuda: bool) -> list[str]:
    """For several nodes: choose the interface and this node's address (tuned_runtime/nodes.py),
    export it for gloo (and NCCL), and say on stderr what is used and what listens where."""
    keys = INTERFACE_VARIABLES if cuda else INTERFACE_VARIABLES[:1]
    return [
        f'if ! found="$("$PYTHON" "$here/{HELPER}" "$host" "$port" "$iface")"; then',
        f'  echo "{script}: cannot choose the interface for the rendezvous at $endpoint" >&2; exit 2',
        "fi",
        'read -r iface address host_is_here <<<"$found"',
        *[_keep_or_set(key, script) for key in keys],
        f'if [ "$node_rank" = 0 ] && [ "$host_is_here" != 1 ]; then echo "{script}: warning: node 0 hosts '
        f'the rendezvous, but $host is not an address of this machine: the other nodes look for it there" >&2; fi',
        f'echo "{script}: node $node_rank of $nnodes, rendezvous at $endpoint; the ranks talk over '
        f'${{{keys[0]}}} ($address)" >&2',
        f'echo "{script}: note: {STORE_NOTE}" >&2',
    ]


def torchrun_command(*, nprocs: int, restarts: bool) -> str:
    """torchrun for one node of several: c10d rendezvous hosted by node 0 (is_host, rather
    than torch's guess from host names), this node announced at the chosen address (the
    ranks' store is reached there); flags before ``"$@"`` (torchrun.sh's user flags follow
    and win). No --node-rank: torchrun reads it for its static rendezvous only, and under
    c10d warns that it ignores it (the nodes' ranks follow their addresses)."""
    restart = ' --max-restarts "$max_restarts"' if restarts else ""
    return ('"$PYTHON" -m torch.distributed.run --nnodes "$nnodes" '
            f"--nproc-per-node {shlex.quote(str(nprocs))} --rdzv-backend c10d "
            '--rdzv-endpoint "$endpoint" --rdzv-id "${RDZV_ID:-autotune-${SLURM_JOB_ID:-$port}}" '
            '--rdzv-conf "is_host=$(( node_rank == 0 ))" --local-addr "$address"' + restart)
