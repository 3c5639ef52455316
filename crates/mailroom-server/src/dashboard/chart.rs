//! The overview's small chart of a topic's traffic: events received, and
//! attempts done and failed, per minute over the last [`MINUTES`] minutes,
//! as an inline SVG (no script, no image request).

use jiff::Timestamp;
use mailroom::operate::Throughput;
use std::fmt::Write as _;

/// Minutes the chart covers.
pub(crate) const MINUTES: usize = 30;
const WIDTH: f64 = 160.0;
const HEIGHT: f64 = 36.0;

/// One topic's per-minute numbers, oldest minute first.
#[derive(Debug, Clone, Default)]
pub(crate) struct Series {
    received: Vec<u64>,
    done: Vec<u64>,
    failed: Vec<u64>,
}

impl Series {
    /// The series of `topic` out of `rows`, for the [`MINUTES`] minutes up
    /// to `now`'s minute.
    pub(crate) fn of(topic: &str, rows: &[Throughput], now: Timestamp) -> Self {
        let last = now.as_second().div_euclid(60);
        let mut s = Series {
            received: vec![0; MINUTES],
            done: vec![0; MINUTES],
            failed: vec![0; MINUTES],
        };
        for t in rows.iter().filter(|t| t.topic == topic) {
            let back = last - t.minute.as_second().div_euclid(60);
            let Some(i) = usize::try_from(back)
                .ok()
                .filter(|b| *b < MINUTES)
                .map(|b| MINUTES - 1 - b)
            else {
                continue;
            };
            s.received[i] += t.received;
            s.done[i] += t.done;
            s.failed[i] += t.failed;
        }
        s
    }

    /// Totals over the chart's minutes: (received, done, failed).
    pub(crate) fn totals(&self) -> (u64, u64, u64) {
        (
            self.received.iter().sum(),
            self.done.iter().sum(),
            self.failed.iter().sum(),
        )
    }

    /// The SVG: three polylines on one scale. Only numbers are written
    /// into it, so it is safe to embed unescaped.
    pub(crate) fn svg(&self) -> String {
        let top = [&self.received, &self.done, &self.failed]
            .iter()
            .flat_map(|v| v.iter())
            .copied()
            .max()
            .unwrap_or(0)
            .max(1);
        let (r, d, f) = self.totals();
        let mut out = format!(
            r#"<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" preserveAspectRatio="none" role="img"><title>last {MINUTES} min: {r} received, {d} done, {f} failed</title>"#
        );
        for (class, values) in [
            ("in", &self.received),
            ("out", &self.done),
            ("failed", &self.failed),
        ] {
            let _ = write!(out, r#"<polyline class="{class}" points=""#);
            for (i, v) in values.iter().enumerate() {
                let x = i as f64 * WIDTH / (MINUTES - 1) as f64;
                let y = HEIGHT - 1.0 - (*v as f64 / top as f64) * (HEIGHT - 2.0);
                let _ = write!(out, "{x:.1},{y:.1} ");
            }
            out.push_str(r#""/>"#);
        }
        out.push_str("</svg>");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each minute lands in its own slot, the current minute last; older
    /// minutes and other topics are left out.
    #[test]
    fn minutes_land_in_their_slots() {
        let now = Timestamp::from_second(1_800_000_000 + 42).unwrap_or(Timestamp::UNIX_EPOCH);
        let minute = |back: i64| {
            Timestamp::from_second(1_800_000_000 - back * 60).unwrap_or(Timestamp::UNIX_EPOCH)
        };
        let row = |topic: &str, back, received| Throughput {
            topic: topic.into(),
            minute: minute(back),
            received,
            done: 1,
            failed: 0,
        };
        let rows = [
            row("t", 0, 5),
            row("t", 2, 7),
            row("t", 30, 99),
            row("u", 0, 50),
        ];
        let s = Series::of("t", &rows, now);
        assert_eq!(s.received[MINUTES - 1], 5);
        assert_eq!(s.received[MINUTES - 3], 7);
        assert_eq!(s.totals(), (12, 2, 0));
        let svg = s.svg();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 3);
    }
}
