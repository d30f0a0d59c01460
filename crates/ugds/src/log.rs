//! Where the library's messages go.
//!
//! ugds reports through `tracing` (a polling fallback, a leaked admin
//! queue, a staging block kept out of use). A Rust application that
//! installs its own subscriber sees them there; the `ugds` binary, the C
//! library and the Python package install [`StderrLog`], which prints them
//! to standard error, at the level `UGDS_LOG` names (`off`, `error`,
//! `warn`, the default, `info`, `debug`, `trace`).

use std::fmt::Write as _;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
pub use tracing::Level;
use tracing::{Event, Metadata, Subscriber};

/// The environment variable that sets the level.
pub const ENV: &str = "UGDS_LOG";

/// Prints events at or above a level to standard error, one line each:
/// `ugds LEVEL target: message key=value ...`. Spans are not tracked.
#[derive(Debug, Clone, Copy)]
pub struct StderrLog {
    max: Level,
}

impl StderrLog {
    /// Prints events of `max` and more severe ones.
    pub fn new(max: Level) -> StderrLog {
        StderrLog { max }
    }

    /// Installs this as the process's subscriber, unless one is already.
    pub fn install(self) {
        let _ = tracing::subscriber::set_global_default(self);
    }

    /// The line an event prints.
    fn line(event: &Event<'_>) -> String {
        struct Fields(String, String);
        impl Visit for Fields {
            fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    let _ = write!(self.0, "{value:?}");
                } else {
                    let _ = write!(self.1, " {}={value:?}", field.name());
                }
            }
            fn record_str(&mut self, field: &Field, value: &str) {
                if field.name() == "message" {
                    self.0.push_str(value);
                } else {
                    let _ = write!(self.1, " {}={value}", field.name());
                }
            }
        }
        let mut f = Fields(String::new(), String::new());
        event.record(&mut f);
        let m = event.metadata();
        format!("ugds {} {}: {}{}", m.level(), m.target(), f.0, f.1)
    }
}

impl Subscriber for StderrLog {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        // More verbose levels compare greater.
        *metadata.level() <= self.max
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::from_level(self.max))
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        eprintln!("{}", StderrLog::line(event));
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// The level `value` names (`None` for `off`), or why it names none.
pub fn parse_level(value: &str) -> Result<Option<Level>, String> {
    Ok(Some(match value.trim().to_ascii_lowercase().as_str() {
        "off" | "none" => return Ok(None),
        "error" => Level::ERROR,
        "warn" | "warning" => Level::WARN,
        "info" => Level::INFO,
        "debug" => Level::DEBUG,
        "trace" => Level::TRACE,
        other => return Err(format!("{ENV}={other}: use off, error, warn, info, debug or trace")),
    }))
}

/// Installs [`StderrLog`] as the process's subscriber at the level `UGDS_LOG`
/// names, else `default`; does nothing where one is installed already, or
/// for `off`. An unknown value is said on standard error and the default
/// used.
pub fn install_from_env(default: Level) {
    let level = match std::env::var(ENV) {
        Ok(v) => parse_level(&v).unwrap_or_else(|e| {
            eprintln!("ugds: {e}; using {default}");
            Some(default)
        }),
        Err(_) => Some(default),
    };
    if let Some(l) = level {
        StderrLog::new(l).install();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn levels_parse_and_unknown_ones_say_so() {
        assert_eq!(parse_level("WARN"), Ok(Some(Level::WARN)));
        assert_eq!(parse_level(" debug\n"), Ok(Some(Level::DEBUG)));
        assert_eq!(parse_level("off"), Ok(None));
        assert!(parse_level("loud").unwrap_err().contains("UGDS_LOG=loud"));
    }

    /// The filter and the line format, through a subscriber that keeps
    /// the lines instead of printing them.
    #[test]
    fn events_below_the_level_are_dropped_and_fields_are_printed() {
        struct Keep(StderrLog, Arc<Mutex<Vec<String>>>);
        impl Subscriber for Keep {
            fn enabled(&self, m: &Metadata<'_>) -> bool {
                self.0.enabled(m)
            }
            fn new_span(&self, a: &Attributes<'_>) -> Id {
                self.0.new_span(a)
            }
            fn record(&self, _: &Id, _: &Record<'_>) {}
            fn record_follows_from(&self, _: &Id, _: &Id) {}
            fn event(&self, e: &Event<'_>) {
                self.1.lock().unwrap().push(StderrLog::line(e));
            }
            fn enter(&self, _: &Id) {}
            fn exit(&self, _: &Id) {}
        }
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sub = Keep(StderrLog::new(Level::WARN), lines.clone());
        tracing::subscriber::with_default(sub, || {
            tracing::info!("not shown");
            tracing::warn!(qid = 3, "queue polls");
            tracing::error!("failed: {}", "why");
        });
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].starts_with("ugds WARN ") && lines[0].ends_with(": queue polls qid=3"), "{}", lines[0]);
        assert!(lines[1].ends_with(": failed: why"), "{}", lines[1]);
    }
}
