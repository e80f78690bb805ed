"""The benchmark's outputs besides the JSON: a markdown table on stdout and a grouped bar chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CASE_ORDER = ("spark_kafka", "wal_on", "wal_off", "wal_on_confluent", "exactly_once", "raw_client")  # plotted


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def markdown(report: dict[str, Any]) -> str:
    rows = report["rows"]
    lines = [f"### {rows:,} rows (10 KB: fewer, see rows), median of {report['reps']} run(s), Spark local[2,4] on "
             f"{report['cores']} cores", "",
             "| records | rows | topic partitions | case | median s | rows/s | runs (s) | CPU µs/record | "
             "last warm-up / median (s, CPU) |",
             "|---|---:|---:|---|---:|---:|---|---:|---|"]
    for e in report["results"]:
        runs = ", ".join(_fmt(r, ".2f") for r in e["runs"])
        warm = (f"{_fmt(e.get('last_warmup_vs_median_seconds'), '.2f')}, "
                f"{_fmt(e.get('last_warmup_vs_median_cpu'), '.2f')}" if "last_warmup_vs_median_seconds" in e else "")
        lines.append(f"| {_shape(e)} | {e['rows']:,} | {e['topic_partitions']} | {e['case']} | "
                     f"{_fmt(e['median_seconds'], '.2f')} | {_fmt(e['rows_per_second'], ',.0f')} | {runs} | "
                     f"{_fmt(e.get('cpu_us_per_record'), '.2f')} | {warm} |")
    lines += ["", "| records | topic partitions | wal_on / spark_kafka | wal_on / wal_off | "
              "wal_on / wal_on_confluent | wal_on / raw_client | per core (wal_on/2 vs raw/1) | "
              "exactly_once / spark_kafka | exactly_once / wal_on |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["ratios"]:
        lines.append(f"| {_shape(r)} | {r['topic_partitions']} | {_fmt(r['wal_on_vs_spark_kafka'], '.2f')} | "
                     f"{_fmt(r['wal_on_vs_wal_off'], '.2f')} | {_fmt(r.get('wal_on_vs_wal_on_confluent'), '.2f')} | "
                     f"{_fmt(r['wal_on_vs_raw_client'], '.2f')} | "
                     f"{_fmt(r['wal_on_vs_raw_client_per_core'], '.2f')} | "
                     f"{_fmt(r.get('exactly_once_vs_spark_kafka'), '.2f')} | "
                     f"{_fmt(r.get('exactly_once_vs_wal_on'), '.2f')} |")
    lines += ["", "| records | topic partitions | CPU/record: wal_on / spark_kafka | exactly_once / spark_kafka | "
              "wal_on / wal_off | wal_on / python_floor | spark_kafka / python_floor |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for r in report["ratios"]:
        lines.append(f"| {_shape(r)} | {r['topic_partitions']} | {_fmt(r.get('cpu_wal_on_vs_spark_kafka'), '.2f')} | "
                     f"{_fmt(r.get('cpu_exactly_once_vs_spark_kafka'), '.2f')} | "
                     f"{_fmt(r.get('cpu_wal_on_vs_wal_off'), '.2f')} | "
                     f"{_fmt(r.get('cpu_wal_on_vs_python_floor'), '.2f')} | "
                     f"{_fmt(r.get('cpu_spark_kafka_vs_python_floor'), '.2f')} |")
    lines.append(f"- CPU counted by {report.get('cpu_accounting', '?')} (bench.cpu)")
    lines.append("")
    for r in report["worker_peak_rss"]:
        lines.append(f"- Python worker peak RSS during wal_on, {_shape(r)}: "
                     f"{r['wal_on_worker_peak_rss_mib']:.0f} MiB VmRSS, {r['wal_on_worker_peak_anon_mib']:.0f} MiB "
                     f"anonymous (VmRSS by topic partitions: {r['by_topic_partitions']})")
    retry = report.get("retry_cost") or {}
    if retry:
        lines.append(f"- Retry cost (100 B, 4-partition topic, every partition's worker SIGKILLed after "
                     f"{retry['kill_after_records']:,} records): "
                     f"median {_fmt(retry['killed_median_seconds'], '.2f')} s "
                     f"vs {_fmt(retry['no_kill_median_seconds'], '.2f')} s undisturbed, "
                     f"extra {_fmt(retry['extra_seconds'], '.2f')} s")
        for k in retry["killed_runs"]:
            lines.append(f"  - published {k['published']}, skipped {k['skipped']}, retried partitions "
                         f"{k['retried_partitions']}, re-sent {k['records_resent']}, topic holds exactly the rows: "
                         f"{k['topic_holds_rows']}")
    for m in report.get("memory_by_partition_size") or []:
        lines.append(f"- One partition of {m['partition_rows']:,} rows ({m['factor']}x), 1 KB values, wal_on: "
                     f"worker peak {_fmt(m['worker_peak_rss_mib'], '.0f')} MiB VmRSS, "
                     f"{_fmt(m['worker_peak_anon_mib'], '.0f')} MiB anonymous, {_fmt(m['seconds'], '.2f')} s")
    verdict = "every run verified" if report["ok"] else "FAILED: " + "; ".join(report["errors"])
    lines.append(f"- Verification: {verdict}")
    return "\n".join(lines)


def _shape(entry: dict[str, Any]) -> str:
    """``100 B``, ``100 B + headers`` (entries of older reports have no headers field)."""
    return f"{entry['value_bytes']} B" + (" + headers" if entry.get("headers") else "")


def plot(results: list[dict[str, Any]], path: Path, rows: int) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display here
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((_shape(e), e["topic_partitions"]) for e in results))
    by_key = {(_shape(e), e["topic_partitions"], e["case"]): e["rows_per_second"] or 0 for e in results}
    width = 0.8 / len(CASE_ORDER)
    fig, ax = plt.subplots(figsize=(12, 5.5))
    for i, case in enumerate(CASE_ORDER):
        xs = [g + (i - (len(CASE_ORDER) - 1) / 2) * width for g in range(len(groups))]
        ys = [by_key.get((v, p, case), 0) for v, p in groups]
        bars = ax.bar(xs, ys, width, label=case)
        ax.bar_label(bars, labels=[f"{y / 1000:.0f}k" for y in ys], fontsize=7, padding=2)
    ax.set_xticks(range(len(groups)), [f"{v} values\n{p}-partition topic" for v, p in groups])
    ax.set_ylabel("rows/s (median)")
    ax.set_title(f"Writing {rows:,} rows (10 KB: fewer) to Kafka (acks=all, idempotent; Spark local[2], "
                 "raw client 1 thread)")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
