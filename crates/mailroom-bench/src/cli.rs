//! What the verbs' command lines and outputs share: the value parsers of
//! their flags, the `--json` line, and the exit code of a durability check.

use anyhow::Context;
use std::process::ExitCode;
use std::time::Duration;

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    mailroom::duration::parse(s).map_err(|e| e.to_string())
}

pub fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => Err(format!("expected on or off, got {s:?}")),
    }
}

pub fn parse_rate(s: &str) -> Result<mailroom::Rate, String> {
    mailroom::Rate::parse(s).map_err(|e| e.to_string())
}

/// Prints one JSON object on one line (the `--json` output of every bench).
pub fn print_json(out: &serde_json::Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string(out).context("encoding JSON")?);
    Ok(())
}

/// Success, or 2 (after saying so) when intake acknowledged events that
/// were not stored as acknowledged.
pub fn durability_code(durable: bool) -> ExitCode {
    if durable {
        ExitCode::SUCCESS
    } else {
        eprintln!("mailroom-bench: stored events do not match the acknowledged ones");
        ExitCode::from(2)
    }
}
