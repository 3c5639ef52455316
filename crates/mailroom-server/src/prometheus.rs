//! The one Prometheus recorder setup, shared by `mailroom serve` and the
//! bench's serve child so they cannot drift: every duration metric (name
//! ending in `_seconds`) is a histogram with [`DURATION_BUCKETS`],
//! which Prometheus can aggregate across instances (a summary cannot).

use crate::MetricsRenderer;
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Histogram bucket bounds for durations, in seconds: 1 ms to 60 s.
pub const DURATION_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
];

/// How often the recorder's upkeep runs.
const UPKEEP: Duration = Duration::from_secs(5);

/// The recorder builder with mailroom's histogram buckets.
pub fn builder() -> Result<PrometheusBuilder, BuildError> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &DURATION_BUCKETS)
}

/// Installs the process-wide recorder with every metric's help text
/// ([`mailroom::metrics::describe`]), runs its upkeep until `shutdown`
/// (on the current Tokio runtime), and returns what renders `/metrics`.
pub fn install(shutdown: CancellationToken) -> Result<MetricsRenderer, BuildError> {
    let handle = builder()?.install_recorder()?;
    mailroom::metrics::describe();
    tokio::spawn(upkeep(handle.clone(), shutdown));
    Ok(Arc::new(move || handle.render()))
}

async fn upkeep(handle: PrometheusHandle, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(UPKEEP) => handle.run_upkeep(),
            () = shutdown.cancelled() => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mailroom::metrics::Kind;

    /// A `_seconds` histogram renders as a Prometheus histogram with every
    /// bucket from 1 ms to 60 s; another histogram name is untouched.
    #[test]
    fn durations_render_as_histograms_with_buckets_from_1ms_to_60s() {
        let recorder = builder().expect("builder").build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            metrics::histogram!("x_duration_seconds", "topic" => "t").record(0.002);
        });
        let text = handle.render();
        assert!(
            text.contains("# TYPE x_duration_seconds histogram"),
            "{text}"
        );
        for le in ["0.001", "0.0025", "1", "60", "+Inf"] {
            let line = format!("x_duration_seconds_bucket{{topic=\"t\",le=\"{le}\"}}");
            assert!(text.contains(&line), "{line} missing in {text}");
        }
        assert_eq!(DURATION_BUCKETS.first(), Some(&0.001));
        assert_eq!(DURATION_BUCKETS.last(), Some(&60.0));
    }

    /// Every metric of the table is exported with its type and its help
    /// text on one `# HELP` line, once described.
    #[test]
    fn described_metrics_carry_their_help_and_type() {
        let recorder = builder().expect("builder").build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            mailroom::metrics::describe();
            for m in mailroom::metrics::ALL {
                let labels: Vec<(&str, &str)> = m.labels.iter().map(|l| (*l, "x")).collect();
                match m.kind {
                    Kind::Counter => metrics::counter!(m.name, &labels).increment(1),
                    Kind::Gauge => metrics::gauge!(m.name, &labels).set(1.0),
                    Kind::Histogram => metrics::histogram!(m.name, &labels).record(0.5),
                }
            }
        });
        let text = handle.render();
        for m in mailroom::metrics::ALL {
            let help = format!("# HELP {} {}\n", m.name, m.help_line());
            assert!(text.contains(&help), "{help} missing in {text}");
            let kind = format!("# TYPE {} {}\n", m.name, m.kind.as_str());
            assert!(text.contains(&kind), "{kind} missing in {text}");
        }
    }
}
