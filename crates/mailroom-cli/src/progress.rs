//! Progress of long operations (`replay` by filter, `purge`) on a
//! terminal, drawn on stderr with indicatif. Nothing is drawn in `--json`
//! mode or when stdout or stderr is not a terminal, so what scripts and
//! pipes read stays exactly as it was.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

/// A progress display, or nothing when it must stay quiet.
pub(crate) struct Progress(Option<ProgressBar>);

/// How often a spinner turns while a long store call runs.
const TICK: Duration = Duration::from_millis(120);

impl Progress {
    /// Whether progress may be drawn: a person is watching both streams.
    fn shown(json: bool) -> bool {
        !json && std::io::stdout().is_terminal() && std::io::stderr().is_terminal()
    }

    /// A bar over `total` items, with counts, rate and time left.
    pub(crate) fn bar(json: bool, total: u64, what: &str) -> Self {
        Self::new(json, ProgressBar::new(total), what, || {
            ProgressStyle::with_template(
                "{spinner} {msg} [{bar:30}] {pos}/{len} ({per_sec}, {eta} left)",
            )
        })
    }

    /// A spinner with the time spent, for work of unknown length.
    pub(crate) fn spinner(json: bool, what: &str) -> Self {
        Self::new(json, ProgressBar::new_spinner(), what, || {
            ProgressStyle::with_template("{spinner} {msg} {elapsed}")
        })
    }

    fn new(
        json: bool,
        bar: ProgressBar,
        what: &str,
        style: impl FnOnce() -> Result<ProgressStyle, indicatif::style::TemplateError>,
    ) -> Self {
        if !Self::shown(json) {
            return Self(None);
        }
        // A template of ours that does not parse only loses the styling.
        if let Ok(style) = style() {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_draw_target(ProgressDrawTarget::stderr());
        bar.set_message(what.to_owned());
        bar.enable_steady_tick(TICK);
        Self(Some(bar))
    }

    /// Sets how many items are done.
    pub(crate) fn set(&self, done: u64) {
        if let Some(bar) = &self.0 {
            bar.set_position(done);
        }
    }

    /// Removes the display, leaving the terminal for the summary.
    pub(crate) fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
