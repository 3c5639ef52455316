//! `reference/metrics.md`, from `mailroom::metrics::ALL`.

use super::markdown::{cell, table};
use mailroom::metrics::ALL;

/// The page.
pub fn render() -> String {
    let mut out = super::generated_note("the metrics table in `crates/mailroom/src/metrics.rs`");
    out.push_str("\n# Metrics\n\n");
    out.push_str(
        "`mailroom serve` exposes these at `GET /metrics` in the Prometheus text format \
         (with `protect_metrics = true` and an `api_token`, the route needs the token). \
         Every metric carries its help text as `# HELP`. Durations are histograms in \
         seconds with buckets from 1 ms to 60 s (`_bucket`, `_sum` and `_count` series), \
         so they can be aggregated across instances. Labels are bounded: never an event id.\n\n",
    );
    let rows: Vec<Vec<String>> = ALL
        .iter()
        .map(|m| {
            let labels = if m.labels.is_empty() {
                "none".to_owned()
            } else {
                m.labels
                    .iter()
                    .map(|l| format!("`{l}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            vec![
                format!("`{}`", m.name),
                m.kind.as_str().to_owned(),
                labels,
                cell(&m.help_line()),
            ]
        })
        .collect();
    table(&mut out, &["name", "type", "labels", "help"], &rows);
    out
}
