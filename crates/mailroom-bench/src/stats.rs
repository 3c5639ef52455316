//! Latency samples: microseconds in a `Vec<u32>`, sorted once at the end
//! (the run is bounded by its duration, so the vector is too).

use std::collections::BTreeMap;
use std::time::Duration;

/// Recorded latencies, in microseconds.
#[derive(Debug, Default)]
pub struct Latencies {
    micros: Vec<u32>,
    sorted: bool,
}

impl Latencies {
    pub fn record(&mut self, d: Duration) {
        self.micros
            .push(u32::try_from(d.as_micros()).unwrap_or(u32::MAX));
        self.sorted = false;
    }

    pub fn extend(&mut self, other: Latencies) {
        self.micros.extend(other.micros);
        self.sorted = false;
    }

    pub fn sort(&mut self) {
        self.micros.sort_unstable();
        self.sorted = true;
    }

    /// The `q` quantile (nearest rank) in milliseconds; NaN when empty.
    /// Call [`Latencies::sort`] first.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        debug_assert!(self.sorted || self.micros.len() < 2);
        if self.micros.is_empty() {
            return f64::NAN;
        }
        let n = self.micros.len();
        let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
        f64::from(self.micros[rank - 1]) / 1000.0
    }
}

/// Milliseconds with sensible precision, `-` for none.
pub fn fmt_ms(ms: f64) -> String {
    if ms.is_nan() {
        "-".into()
    } else if ms < 10.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.1}")
    }
}

/// CPU shares as `total% [name n%, ...]`.
pub fn fmt_cpu(cpu: &BTreeMap<String, f64>) -> String {
    let parts: Vec<String> = cpu
        .iter()
        .map(|(k, v)| format!("{k} {:.0}%", v * 100.0))
        .collect();
    format!(
        "{:.0}% [{}]",
        cpu.values().sum::<f64>() * 100.0,
        parts.join(", ")
    )
}

/// A ratio as `1.23x`, or `-` where there is no figure.
pub fn fmt_times(ratio: Option<f64>) -> String {
    ratio.map_or_else(|| "-".into(), |x| format!("{x:.2}x"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let mut l = Latencies::default();
        for us in (1..=100).rev() {
            l.record(Duration::from_micros(us * 1000));
        }
        l.sort();
        assert_eq!(l.quantile_ms(0.5), 50.0);
        assert_eq!(l.quantile_ms(0.99), 99.0);
        assert_eq!(l.quantile_ms(1.0), 100.0);
        assert!(Latencies::default().quantile_ms(0.5).is_nan());
        assert_eq!(fmt_ms(f64::NAN), "-");
    }
}
