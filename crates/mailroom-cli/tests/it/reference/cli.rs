//! `reference/cli.md`, from clap's definition (`mailroom_cli::command`).

use super::markdown::{cell, one_line, table};
use clap::{Arg, Command};

/// The page.
pub fn render() -> String {
    let mut root = mailroom_cli::command();
    root.build();
    let mut out =
        super::generated_note("the command line's definition in `crates/mailroom-cli/src/lib.rs`");
    out.push_str("\n# Command line\n\n");
    if let Some(about) = root.get_about() {
        out.push_str(&format!("{}\n\n", one_line(&about.to_string())));
    }
    out.push_str(
        "Every verb reads the configuration file (`--config`, else `$MAILROOM_CONFIG`, \
         else `./mailroom.toml` if present, else the built-in defaults) with its \
         `MAILROOM_*` overrides, and works on the store it names. `mailroom help <verb>` \
         and `mailroom <verb> --help` print the same text as this page.\n\n",
    );
    out.push_str("## Global options\n\nAccepted by every verb, before or after it.\n\n");
    let globals: Vec<&Arg> = root.get_arguments().filter(|a| !is_builtin(a)).collect();
    arguments(&mut out, &globals);
    out.push_str("`--help` (`-h`) prints a verb's help, `--version` (`-V`) the version.\n\n");
    for sub in root.get_subcommands().filter(|s| s.get_name() != "help") {
        verb(&mut out, sub, "mailroom");
    }
    out
}

/// `--help`, `--version`: clap's own.
fn is_builtin(arg: &Arg) -> bool {
    matches!(arg.get_id().as_str(), "help" | "version")
}

fn verb(out: &mut String, cmd: &Command, parent: &str) {
    let path = format!("{parent} {}", cmd.get_name());
    let subcommands: Vec<&Command> = cmd
        .get_subcommands()
        .filter(|s| s.get_name() != "help")
        .collect();
    let own: Vec<&Arg> = cmd
        .get_arguments()
        .filter(|a| !is_builtin(a) && !a.is_global_set())
        .collect();
    out.push_str(&format!("## `{path}`\n\n"));
    let about = cmd.get_long_about().or(cmd.get_about());
    if let Some(about) = about {
        out.push_str(&format!("{}\n\n", one_line(&about.to_string())));
    }
    out.push_str(&format!(
        "```text\n{}\n```\n\n",
        usage(&path, &own, !subcommands.is_empty())
    ));
    arguments(out, &own);
    for sub in subcommands {
        verb(out, sub, &path);
    }
}

/// `mailroom replay [OPTIONS] [ID]`.
fn usage(path: &str, args: &[&Arg], has_subcommands: bool) -> String {
    let mut line = path.to_owned();
    if has_subcommands {
        line.push_str(" <COMMAND>");
        return line;
    }
    if args.iter().any(|a| !a.is_positional()) {
        line.push_str(" [OPTIONS]");
    }
    for a in args.iter().filter(|a| a.is_positional()) {
        let name = value_name(a);
        if a.is_required_set() {
            line.push_str(&format!(" <{name}>"));
        } else {
            line.push_str(&format!(" [{name}]"));
        }
    }
    line
}

fn value_name(arg: &Arg) -> String {
    arg.get_value_names()
        .and_then(|names| names.first())
        .map(|n| n.to_string())
        .unwrap_or_else(|| arg.get_id().as_str().to_uppercase())
}

/// The table of `args`: how each is written, its default, what it does.
fn arguments(out: &mut String, args: &[&Arg]) {
    if args.is_empty() {
        return;
    }
    let rows: Vec<Vec<String>> = args
        .iter()
        .map(|a| {
            let written = if a.is_positional() {
                format!("`{}`", value_name(a))
            } else {
                let mut forms = Vec::new();
                if let Some(long) = a.get_long() {
                    forms.push(format!("--{long}"));
                }
                if let Some(short) = a.get_short() {
                    forms.push(format!("-{short}"));
                }
                let takes_value = a.get_num_args().is_some_and(|n| n.takes_values());
                let value = if takes_value {
                    format!(" <{}>", value_name(a))
                } else {
                    String::new()
                };
                forms
                    .iter()
                    .map(|f| format!("`{f}{value}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let takes_value = a.get_num_args().is_some_and(|n| n.takes_values());
            // A flag's implicit `false` is no default worth a cell.
            let defaults = if takes_value {
                a.get_default_values()
            } else {
                &[]
            };
            let default = defaults
                .iter()
                .map(|v| format!("`{}`", v.to_string_lossy()))
                .collect::<Vec<_>>()
                .join(", ");
            let mut help = a
                .get_long_help()
                .or(a.get_help())
                .map(|h| h.to_string())
                .unwrap_or_default();
            let values: Vec<String> = a
                .get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| format!("`{}`", v.get_name()))
                .collect();
            if !help.is_empty() && !help.ends_with('.') {
                help.push('.');
            }
            if !values.is_empty() && takes_value {
                help.push_str(&format!(" One of {}.", values.join(", ")));
            }
            if let Some(env) = a.get_env() {
                help.push_str(&format!(" Also from `${}`.", env.to_string_lossy()));
            }
            vec![written, cell(&default), cell(&help)]
        })
        .collect();
    table(out, &["argument", "default", "description"], &rows);
}
