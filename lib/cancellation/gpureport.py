"""gpu-check's report (`python -m cancellation.gpucheck`): the sampler step's rows as the report holds them (`rows`), the
JSON and markdown written after every step (`write`), the markdown itself (`markdown`: one status table, then each
step's numbers; `sampler_table`: the sampler and vLLM rows beside each shape's weight-read limit). Standard library
and `sampling_path` only, as gpucheck itself (a bare GPU machine may lack pandas and pyyaml).
"""
from __future__ import annotations

import json
from pathlib import Path

from .sampling_path import choose, choose_sampler, default_cuda_sampler, sampler_rows


def rows(raw) -> list[dict]:
    """bench_sampling.sampler's (shape, way, tokens/s, first call s) tuples as the report's rows (NaN first call: None)."""
    return [dict(shape=d, way=w, tokens_per_s=t, first_call_s=None if f is None or f != f else f) for d, w, t, f in raw]


def write(stem: Path, report: dict) -> dict:
    """`report` (gpu-check's record: device, budget, dry runs' sizes, steps) with the sampling choices of its numbers
    (`sampler_choice`, `sampler_auto`) and of the newest other report of its kind (`sampler_choice_committed`),
    written to <stem>.json (atomically) and <stem>.md (`markdown`). Returns it."""
    dev = report["device"]
    if sampler_rows(report):
        report["sampler_choice"] = choose_sampler(report)
    nbs = next((s.get("notebooks") for s in report["steps"] if s.get("step") == "sampler" and s.get("notebooks")), None)
    if nbs:   # what `hf_sampler: auto` resolves to per notebook on this kind from this report (sampling_path.choose)
        report["sampler_auto"] = {nb: {**choose(report, v["calls"]), "backend": v["backend"]} for nb, v in nbs.items()}
    report["sampler_choice_committed"] = default_cuda_sampler(dev["kind"], exclude=stem.with_suffix(".json"))
    tmp = stem.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str) + "\n")
    tmp.replace(stem.with_suffix(".json"))
    stem.with_suffix(".md").write_text(markdown(report))
    return report


def markdown(report: dict) -> str:
    """The report as markdown: one status table, then each step's numbers."""
    d = report["device"]
    lines = [f"# gpu-check, {d['date']}: {d['name']} ({d['kind']}, {d['memory_gib']} GiB), torch {d['torch']}",
             "", f"Budget {report['budget_s']:.0f} s, spent {report['spent_s']:.0f} s. "
             "Written by `python -m cancellation.gpucheck` (`make gpu-check`).", "",
             *([f"Calls: {'; '.join(report['calls'])}.", ""] if report.get("calls") else []),
             *(["**The machine:** driver " + str(d.get("driver")) + f", CUDA {d.get('cuda')}, Python {d.get('python')}; "
                + ", ".join(f"{k} {v['version'] or 'absent'}" + ("" if v["importable"] or not v["version"] else
                                                                 " (does not import)")
                            for k, v in d["packages"].items()), ""] if d.get("packages") else []),
             "| step | status | seconds |", "|---|---|---|"]
    for s in report["steps"]:
        status = f"skipped ({s['skipped']})" if "skipped" in s else ("ok" if s["rc"] == 0 else
                                                                     "timed out" if s["rc"] == 124 else f"failed (rc {s['rc']})")
        lines.append(f"| {s['step']} | {status} | {s.get('seconds', '')} |")
    for s in report["steps"]:
        if s.get("step") == "pytest" and "output_tail" in s:
            last = [x for x in s["output_tail"].splitlines() if x.strip()][-1:] or [""]
            lines += ["", f"**pytest -m gpu:** {last[0]}"]
        if s.get("step") in ("sampler", "vllm") and not any(x.startswith("**Sampler,") for x in lines) and (
                sampler_rows(report) or s.get("step") == "vllm"):   # one table: both steps' rows, or why vllm has none
            lines += ["", *sampler_table(report)]
        if s.get("profile"):
            pr = s["profile"]
            lines += ["", f"**One decode step, {pr['rows']} rows, prompt {pr['prompt']}, {pr['new']} new tokens** "
                      f"(captured graph {pr['captured_ms_per_step']:.2f} ms/step = {pr['tokens_per_s_captured']:,.0f} "
                      f"tokens/s; the same step eagerly: {pr['eager_cuda_ms_per_step']:.2f} ms of kernels/step):", "",
                      "| kernel | calls | ms per step | share |", "|---|---|---|---|"]
            for k in pr["kernels"]:
                lines.append(f"| `{k['name']}` | {k['calls']} | {k['ms']:.3f} | {100 * k['share']:.1f}% |")
        if s.get("units"):
            u = s["units"]
            lines += ["", f"**Unit costs at Qwen3-1.7B's shape** (`{s.get('file', '')}`):", "",
                      "| block | s per 1k parameter-tokens x 1e9 params | s per call |", "|---|---|---|"]
            for k, v in u.items():
                if "s_per_param_token" in v:
                    lines.append(f"| {k} | {v['s_per_param_token'] * 1e12:.3g} | {v['s_per_call']:.3g} |")
            if "start" in u:
                lines.append(f"| notebook start | | {u['start']['seconds']:.1f} |")
        if s.get("trim"):
            lines += ["", "**trim_padding at Qwen3-1.7B's shape**, float32, random weights, responses stopping at lengths "
                      "spread from 1/8 of the cap to the cap (`scale.trim_probe`):", "",
                      "| block | rows x columns | chunk_rows | positions run | full (s) | trimmed (s) | speed-up | max abs diff |",
                      "|---|---|---|---|---|---|---|---|"]
            for r in s["trim"]:
                lines.append(f"| {r['block']} | {r['rows']} x {r['columns']} | {r['chunk_rows']} | "
                             f"{r['positions_share']:.0%} | {r['seconds_full']:.2f} | {r['seconds_trim']:.2f} | "
                             f"{r['speedup']:.2f}x | {r['max_abs_diff']:.1e} |")
    dry = [s for s in report["steps"] if s.get("step", "").startswith("dry-")]
    if dry:
        sizes = ", ".join(f"{k} {v}" for k, v in report.get("dry_sizes", {}).items()
                          if k not in ("model_path", "device"))
        extra = "; ".join(f"{nb}: " + ", ".join(f"{k} {v}" for k, v in kv.items())
                          for nb, kv in report.get("dry_per_notebook", {}).items())
        lines += ["", f"**Dry runs at Qwen3-1.7B's shape** (`--dry-run`, profile {report.get('dry_profile', 'paper-vocab')}, "
                  f"{sizes}; {extra}):", "",
                  "| notebook | backend | measured: time, peak GPU | planned: time, peak | measured / planned |",
                  "|---|---|---|---|---|"]
        for s in dry:
            m = s.get("measured")
            back = s.get("backend", "") + (f" ({s['fallback']})" if s.get("fallback") else "")
            if not m:
                why = s.get("skipped") or f"rc {s.get('rc')}"
                lines.append(f"| {s['step'][4:]} | {back} | not measured ({why}) | | |")
                continue
            p = m.get("planned") or {}
            t, g = m["measured_seconds"], m.get("peak_cuda_gib") or float("nan")
            pt, pg = p.get("predicted_seconds"), p.get("peak_gib")
            ratio = f"{t / pt:.2f}x, {g / pg:.2f}x" if pt and pg else ""
            lines.append(f"| {m['notebook']} | {back} | {t:.0f} s, {g:.1f} GiB | "
                         + (f"{pt:.0f} s, {pg:.1f} GiB" if pt and pg else "no plan") + f" | {ratio} |")
    for key, where in (("sampler_choice", "this run's numbers"), ("sampler_choice_committed", None)):
        c = report.get(key)
        if c:
            src = where or (f"the newest other report of this kind (`{c['report']}`)" if c.get("report") else
                            "no other report of this kind")
            lines += ["", f"**Default CUDA sampling path from {src}:** {c['path']} ({c['why']})."]
    if report.get("sampler_auto"):   # the choice `hf_sampler: auto` makes: end to end, per notebook
        lines += ["", f"**`hf_sampler: auto` per notebook, end to end at its {report.get('dry_profile', 'paper-quick')} "
                  "shapes and call counts** (first calls included; `sampling_path.choose`; the steady-state line "
                  "above is tokens/s only):", "", "| notebook | backend | hf path | why |", "|---|---|---|---|"]
        for nb, c in report["sampler_auto"].items():
            lines.append(f"| {nb} | {c.get('backend', '')} | {c['path']} | {c['why']} |")
    return "\n".join(lines) + "\n"


def sampler_table(report: dict) -> list[str]:
    """The sampler table: the sampler step's rows and the vllm step's, by shape, each beside its shape's
    weight-read limit; a vllm step that measured nothing as one row saying why."""
    rows = sampler_rows(report)
    limit = {r["shape"]: r["tokens_per_s"] for r in rows if r["way"] == "weight-read limit"}
    lines = ["**Sampler, Qwen3-1.7B shape, bfloat16, random weights, no stop ids** (`bench sampler`; vLLM: "
             "`gpucheck.sampler_vllm`, the same prompts and sizes):", "",
             "| rows x new | way | tokens/s | first call (s) | of the weight-read limit |", "|---|---|---|---|---|"]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    for sh in shapes:
        mine = [r for r in rows if r["shape"] == sh]
        for r in sorted(mine, key=lambda r: r["way"] == "weight-read limit"):
            f = "" if r["first_call_s"] is None else f"{r['first_call_s']:.1f}"
            share = "" if r["way"] == "weight-read limit" or sh not in limit else \
                f"{100 * r['tokens_per_s'] / limit[sh]:.1f}%"
            lines.append(f"| {r['shape']} | {r['way']} | {r['tokens_per_s']:,.0f} | {f} | {share} |")
    v = next((s for s in report.get("steps", []) if s.get("step") == "vllm"), None)
    if v is not None and not v.get("rows"):
        why = v.get("skipped") or v.get("error") or ("timed out" if v.get("rc") == 124 else f"failed (rc {v.get('rc')})")
        lines.append(f"| {', '.join(shapes)} | {why if why.startswith('vllm') else 'vllm: ' + why} | | | |")
    return lines
