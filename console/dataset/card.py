"""The dataset card: README.md in the Hugging Face format (a YAML header with `configs`,
`dataset_info` features and a size category), then what the run was and how it was made.
The license and the description are the user's to write: marked TODO, never guessed."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from console.dataset.export import DATA, Figures
from console.dataset.rows import FEATURES
from console.dataset.source import Data

TODO = "TODO(fill in before publishing)"


def size_category(n: int) -> str:
    for top, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
                      (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M"),
                      (100_000_000, "10M<n<100M")):
        if n < top:
            return name
    return "n>100M"


def percentiles(values: list[int]) -> dict[str, int]:
    if not values:
        return {}
    s = sorted(values)
    return {f"p{p}": s[min(len(s) - 1, (len(s) * p) // 100)] for p in (10, 50, 90, 99)} | \
        {"max": s[-1]}


def _yaml(v: Any, indent: int) -> list[str]:
    """A small YAML writer for the header (JSON scalars are YAML)."""
    pad = " " * indent
    out: list[str] = []
    if isinstance(v, dict):
        for k, x in v.items():
            if isinstance(x, dict | list) and x:
                out.append(f"{pad}{k}:")
                out += _yaml(x, indent + 2)
            else:
                out.append(f"{pad}{k}: {json.dumps(x)}")
    else:
        for x in v:
            if isinstance(x, dict) and x:
                inner = _yaml(x, indent + 2)
                out.append(f"{pad}- {inner[0].lstrip()}")
                out += inner[1:]
            else:
                out.append(f"{pad}- {json.dumps(x)}")
    return out


def header(fig: Figures) -> str:
    meta = {
        "license": "other",
        "size_categories": [size_category(fig.rows)],
        "configs": [{"config_name": "default",
                     "data_files": [{"split": "train", "path": f"{DATA}/train-*.parquet"}]}],
        "dataset_info": {"features": FEATURES,
                         "splits": [{"name": "train", "num_examples": fig.rows}]},
        "tags": ["synthetic", "fleetdeck"],
    }
    return "---\n" + "\n".join(_yaml(meta, 0)) + "\n---\n"


def _lengths_row(name: str, values: list[int]) -> str:
    p = percentiles(values)
    if not p:
        return f"| {name} | 0 | - | - | - | - |"
    cells = " | ".join(f"{p[k]:,}" for k in ("p10", "p50", "p90", "max"))
    return f"| {name} | {len(values):,} | {cells} |"


def card(data: Data, fig: Figures) -> str:
    prog, prov = data.progress, data.provenance
    lines = [header(fig), f"# {TODO}: the dataset's name", "",
             f"**License:** {TODO} (set `license:` in the header above too; `other` is a "
             "placeholder).", "", f"**Description:** {TODO}: what the prompts are, what the "
             "answers are for, known limits.", "",
             "Generated with fleetdeck from "
             f"{data.what}. Every row is the current line of its prompt index (the highest "
             "attempt; superseded and failed lines are left out; failures are listed apart in "
             "`failures.jsonl`).", "", "## What the run was", "",
             f"- rows: {fig.rows:,} in {len(fig.shards)} Parquet shard(s) under `{DATA}/`",
             f"- lines read: {fig.stats.lines:,}; superseded by a later attempt: "
             f"{fig.stats.superseded:,}" + (f"; named by no commit (left out): "
                                            f"{fig.stats.left_out:,}"
                                            if data.kind == "campaign" else ""),
             f"- failed (no row): {len(data.failures):,}"]
    if prog:
        wall = prog.get("elapsed_hours")
        lines.append(f"- wall time: {wall:.2f} h" if isinstance(wall, int | float)
                     else "- wall time: unknown")
        gh = prog.get("gpu_hours")
        lines.append(f"- GPU-hours: {gh:,.2f} on {prog.get('gpus', '?')} GPU(s)"
                     if isinstance(gh, int | float) else "- GPU-hours: unknown")
        cost = prog.get("cost")
        lines.append(f"- cost: {json.dumps(cost)}" if cost else
                     "- cost: unknown (no `[run] cost_per_gpu_hour`)")
    else:
        lines.append("- wall time, GPU-hours, cost: per node (see each node's progress)")
    lines += ["", "### Finish reasons", "", "| finish_reason | rows |", "|---|---|"]
    lines += [f"| {k} | {v:,} |" for k, v in fig.finish.most_common()]
    lines += ["", "### Truncated at the max-tokens limit", "",
              "| max_tokens | rows | cut at the limit | share |", "|---|---|---|---|"]
    for limit in sorted(fig.answers_by_limit):
        n, t = fig.answers_by_limit[limit], fig.truncated_by_limit[limit]
        lines.append(f"| {limit} | {n:,} | {t:,} | {t / n:.1%} |")
    lines += ["", "### Output length (completion tokens)", "",
              "| rows | count | p10 | p50 | p90 | max |", "|---|---|---|---|---|---|",
              _lengths_row("all", fig.lengths)]
    hedged_or_retried = len(fig.hedged) + len(fig.deadline)
    rest = _rest(fig)
    lines += [_lengths_row("a hedge's winner", fig.hedged),
              _lengths_row("sent again after a missed deadline", fig.deadline),
              _lengths_row("the rest", rest), "",
              "A hedge keeps the first of two copies to answer and a deadline's retry samples "
              "again after an abort: both favour shorter answers for the slowest (longest) "
              f"prompts. {hedged_or_retried:,} row(s) are such; compare their lengths with "
              "the rest's above.", "", "### Failures by class", ""]
    if data.failures:
        lines += ["| class | indices |", "|---|---|"]
        lines += [f"| {k} | {v:,} |" for k, v in
                  Counter(f.error for f in data.failures).most_common()]
    else:
        lines.append("none")
    lines += ["", "## How it was made", "", *_provenance(data, prov)]
    lines += ["", "## Schema", "", "One row per prompt index: `index`, `id`, `messages` "
              "(list of {role, content, extra: the message's other keys as JSON}), "
              "`reasoning`, `content`, `tool_calls` and `tools` (JSON strings), "
              "`finish_reason`, `usage` {prompt, completion, reasoning tokens}, "
              "`max_tokens`, `attempt`, `hedged`, `model`, `server`.", ""]
    return "\n".join(lines)


def _rest(fig: Figures) -> list[int]:
    """Lengths of the rows that are neither a hedge's winner nor a deadline's retry (counts
    taken off by value: the lists hold lengths, not rows)."""
    left = Counter(fig.lengths)
    left.subtract(Counter(fig.hedged))
    left.subtract(Counter(fig.deadline))
    return sorted(left.elements())


def _provenance(data: Data, prov: dict[str, Any] | None) -> list[str]:
    pin = data.pin
    out = [f"- model: `{pin.get('model', '?')}`",
           f"- sampling: `{json.dumps(pin.get('sampling', {}))}`",
           f"- chat template kwargs: `{json.dumps(pin.get('chat_template_kwargs', {}))}`"]
    if pin.get("prompts_sha256"):
        out.append(f"- prompts: {pin.get('prompts_lines', '?')} lines, sha256 "
                   f"`{pin['prompts_sha256']}`")
    caps = prov.get("captures") if isinstance(prov, dict) else None
    if not isinstance(caps, list) or not caps or not isinstance(caps[-1], dict):
        out.append("- server provenance: not recorded (no provenance.json: a run from before "
                   "it was captured, or a campaign, whose nodes keep theirs in S3 under "
                   "journals/NODE/RUN_ID/)")
        return out
    last = caps[-1]
    out += [f"- SGLang: `{last.get('sglang_version')}`",
            f"- reasoning parser: `{last.get('reasoning_parser')}`",
            f"- max_tokens at launch: {last.get('max_tokens')}"]
    files = last.get("model_files") if isinstance(last.get("model_files"), dict) else {}
    if files:
        out += ["- model files (sha256):"] + [f"  - `{k}`: `{v}`" for k, v in files.items()]
    else:
        out.append(f"- model files: not hashed ({last.get('model_files_note')})")
    if last.get("launch_command"):
        out += ["- launch command (secrets redacted):", "", "```sh",
                str(last["launch_command"]).strip(), "```"]
    if len(caps) > 1:
        out.append(f"- the servers changed during the run: {len(caps)} different setups "
                   "recorded in provenance.json")
    out.append("- server args as `/server_info` gave them: `provenance.json` beside this card")
    return out
