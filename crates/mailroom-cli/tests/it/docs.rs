//! The book (`docs/src/`) and the README stay true: every configuration
//! they show is accepted by `mailroom config check`, every `mailroom`
//! command line they show parses, and every relative link and `#anchor`
//! they hold leads somewhere.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every page of the book, and the README: the Markdown a user reads.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .map(|e| e.expect("dir entry").path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "md") {
                out.push(p);
            }
        }
    }
    let mut out = vec![root().join("README.md")];
    walk(&root().join("docs/src"), &mut out);
    assert!(out.len() > 20, "the book's pages: {out:?}");
    out
}

/// A page's path as a reader names it, for failure messages.
fn shown(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

/// A fenced code block: its info string, first line number and text.
#[derive(Debug)]
struct Block {
    info: String,
    line: usize,
    text: String,
}

/// The fenced code blocks of a page (``` or ~~~, indented in lists too;
/// the fence's indentation is removed from the block's lines). Also the
/// page's text outside code blocks, line by line (for links and headings).
fn parse(page: &str) -> (Vec<Block>, Vec<(usize, String)>) {
    let mut blocks = Vec::new();
    let mut prose = Vec::new();
    let mut open: Option<(String, usize, String, Block)> = None;
    for (i, line) in page.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match &mut open {
            None => {
                let fence: String = trimmed
                    .chars()
                    .take_while(|c| *c == '`' || *c == '~')
                    .collect();
                if fence.len() >= 3
                    && fence
                        .chars()
                        .all(|c| c == fence.chars().next().unwrap_or('`'))
                {
                    let info = trimmed[fence.len()..].trim().to_owned();
                    open = Some((
                        fence,
                        indent,
                        String::new(),
                        Block {
                            info,
                            line: i + 1,
                            text: String::new(),
                        },
                    ));
                } else {
                    prose.push((i + 1, line.to_owned()));
                }
            }
            Some((fence, fence_indent, _, block)) => {
                if trimmed.starts_with(fence.as_str())
                    && trimmed.trim_end().chars().all(|c| fence.starts_with(c))
                {
                    let (_, _, _, block) = open.take().expect("open block");
                    blocks.push(block);
                } else {
                    let strip = indent.min(*fence_indent);
                    block.text.push_str(&line[strip..]);
                    block.text.push('\n');
                }
            }
        }
    }
    assert!(open.is_none(), "a code block is never closed");
    (blocks, prose)
}

/// The info string's words: ```toml,fragment → ["toml", "fragment"].
fn info_words(info: &str) -> Vec<&str> {
    info.split([',', ' ']).filter(|w| !w.is_empty()).collect()
}

/// A value for each `${VAR}` a block names: long and mixed enough to pass
/// as an `api_token` on a public listener, and a Standard Webhooks secret
/// (base64 after `whsec_`).
const SECRET: &str = "whsec_RG9jcy1UZXN0LVNlY3JldC0wMTIzNDU2Nzg5LWFiY2RlZg==";

/// The PEM files `config check` reads, by key, and the test certificate
/// (`$MAILROOM_TEST_TLS_DIR`, made by scripts/lib/services.sh) standing in
/// for a page's path such as /etc/mailroom/tls/fullchain.pem.
const PEM_KEYS: [(&str, &str); 5] = [
    ("cert_file", "server.pem"),
    ("key_file", "server.key"),
    ("ca_file", "ca.pem"),
    ("client_cert", "client.pem"),
    ("client_key", "client.key"),
];

/// `text` with the value of each `key = "/path"` of [`PEM_KEYS`] whose file
/// does not exist here replaced by the test certificate's path.
fn with_test_certificates(text: &str) -> String {
    let mut out = text.to_owned();
    for (key, file) in PEM_KEYS {
        let mut from = 0;
        while let Some(at) = out[from..].find(key).map(|i| i + from) {
            let after = &out[at + key.len()..];
            let rest = after.trim_start();
            let Some(rest) = rest.strip_prefix('=') else {
                from = at + key.len();
                continue;
            };
            let rest = rest.trim_start();
            let Some(value) = rest.strip_prefix('"') else {
                from = at + key.len();
                continue;
            };
            let Some(end) = value.find('"') else { break };
            let path = &value[..end];
            let start = out.len() - value.len();
            if !Path::new(path).exists() {
                let test = mailroom_testkit::tls_dir().join(file).display().to_string();
                out.replace_range(start..start + end, &test);
                from = start + test.len();
            } else {
                from = start + end;
            }
        }
    }
    out
}

/// `mailroom config check` of one TOML block: `${VAR}` are set, each
/// `${file:PATH}` points at a temporary file holding a secret, and PEM
/// files at the test certificates (the page's paths, e.g. /run/secrets/x,
/// are not on this machine). `Err` with what mailroom printed.
fn config_check(toml: &str, dir: &Path) -> Result<(), String> {
    let mut text = with_test_certificates(toml);
    let mut vars = BTreeSet::new();
    let mut rest = toml;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else { break };
        let name = &after[..end];
        if let Some(path) = name.strip_prefix("file:") {
            let secret = dir.join(format!("secret-{}", vars.len() + 1000));
            std::fs::write(&secret, format!("{SECRET}\n")).expect("write secret file");
            text = text.replace(
                &format!("${{file:{path}}}"),
                &format!("${{file:{}}}", secret.display()),
            );
        } else {
            vars.insert(name.to_owned());
        }
        rest = &after[end..];
    }
    let config = dir.join("mailroom.toml");
    std::fs::write(&config, text).expect("write config");
    let out = Command::new(env!("CARGO_BIN_EXE_mailroom"))
        .current_dir(dir)
        .arg("--config")
        .arg(&config)
        .args(["config", "check"])
        .env_remove("MAILROOM_CONFIG")
        .env_remove("MAILROOM_LISTEN")
        .env_remove("MAILROOM_STORE_URL")
        .env_remove("MAILROOM_API_TOKEN")
        .envs(vars.iter().map(|v| (v.as_str(), SECRET)))
        .output()
        .expect("run mailroom config check");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Every ```toml block of the book and the README is a configuration that
/// `mailroom config check` accepts, so a reader who copies one gets a
/// mailroom that starts; a block marked ```toml,fragment (not a
/// mailroom.toml, e.g. Cargo.toml lines) must still be valid TOML.
#[test]
fn every_toml_block_passes_config_check() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("read page");
        for block in parse(&text).0 {
            let words = info_words(&block.info);
            if words.first() != Some(&"toml") {
                continue;
            }
            let at = format!("{}:{}", shown(&page), block.line);
            if words.contains(&"fragment") {
                if let Err(e) = block.text.parse::<toml::Table>() {
                    failures.push(format!("{at}: not TOML: {e}"));
                }
                continue;
            }
            let dir = tempfile::tempdir().expect("tempdir");
            checked += 1;
            if let Err(e) = config_check(&block.text, dir.path()) {
                failures.push(format!("{at}: mailroom config check refused it:\n{e}"));
            }
        }
    }
    assert!(checked > 20, "only {checked} TOML blocks found");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// A bad block is caught: the check is not one that passes anything.
#[test]
fn config_check_of_a_block_refuses_a_wrong_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert!(config_check("[[topic]]\nname = \"a\"\nmode = \"sideways\"\n", dir.path()).is_err());
    assert!(config_check("[[topic]]\nname = \"a\"\nmode = \"batch\"\n", dir.path()).is_ok());
}

/// The `mailroom ...` command lines of a shell block (`mailroom serve` in
/// a script, `$ mailroom status` in a console session, where lines without
/// the prompt are output), split into words as a shell would (quotes,
/// trailing `# comments` and anything after a pipe or `&&` dropped).
fn command_lines(block: &Block, console: bool) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for line in block.text.lines() {
        let line = line.trim_start();
        let line = match line.strip_prefix("$ ") {
            Some(command) => command,
            None if console => continue,
            None => line,
        };
        if !line.starts_with("mailroom ") && line != "mailroom" {
            continue;
        }
        out.push(shell_words(line));
    }
    out
}

/// A shell's words of one command: single and double quotes, backslash
/// escapes; stops at an unquoted `#`, `|`, `&`, `;`, `>` or `<`.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    word.push(q);
                }
            }
            '"' => {
                in_word = true;
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' => word.extend(chars.next()),
                        _ => word.push(q),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.extend(chars.next());
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '#' if !in_word => break,
            '|' | '&' | ';' | '>' | '<' => break,
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// Whether `argv` parses with the CLI's clap definition (asking for help or
/// the version counts as parsing).
fn parses(argv: &[String]) -> Result<(), clap::Error> {
    use clap::Parser as _;
    use clap::error::ErrorKind;
    match mailroom_cli::Cli::try_parse_from(argv) {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Every `mailroom ...` command line shown in a ```sh, ```console or
/// ```bash block parses with the CLI's own argument definition: no page
/// shows a verb or a flag that does not exist.
#[test]
fn every_mailroom_command_line_parses() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("read page");
        for block in parse(&text).0 {
            let words = info_words(&block.info);
            if !matches!(words.first(), Some(&("sh" | "console" | "bash" | "shell"))) {
                continue;
            }
            for argv in command_lines(&block, words.first() == Some(&"console")) {
                checked += 1;
                if let Err(e) = parses(&argv) {
                    failures.push(format!(
                        "{}:{}: `{}`: {e}",
                        shown(&page),
                        block.line,
                        argv.join(" ")
                    ));
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} command lines found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The command-line check refuses what the CLI refuses.
#[test]
fn the_command_line_check_refuses_an_unknown_flag() {
    let ok = shell_words("mailroom replay --topic payments --key 'customer 7' # all dead ones");
    assert_eq!(
        ok,
        [
            "mailroom",
            "replay",
            "--topic",
            "payments",
            "--key",
            "customer 7"
        ]
    );
    assert!(parses(&ok).is_ok());
    assert!(parses(&shell_words("mailroom --version")).is_ok());
    assert!(parses(&shell_words("mailroom replay --everything")).is_err());
    assert!(parses(&shell_words("mailroom events shw 01a2")).is_err());
}

/// mdBook's id for a heading's text (mdbook-html's `id_from_content`):
/// lower case, letters, digits, `_` and `-` kept, whitespace to `-`,
/// anything else dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c)
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// The text a heading renders: `[text](url)` → text, code and emphasis
/// marks removed.
fn heading_text(raw: &str) -> String {
    let mut out = String::new();
    let mut rest = raw;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match (after.find("]("), after.find(')')) {
            (Some(close), Some(end)) if close < end => {
                out.push_str(&after[..close]);
                rest = &after[end + 1..];
            }
            _ => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out.replace(['`', '*'], "")
}

/// The anchors of a page: its headings' ids, numbered `-1`, `-2` on
/// repeats as mdBook does, and the `id="..."` of its HTML elements
/// (`<a id="x"></a>`).
fn anchors(prose: &[(usize, String)]) -> HashSet<String> {
    let mut used = HashSet::new();
    for (_, line) in prose {
        let mut rest = line.as_str();
        while let Some(at) = rest.find(" id=\"") {
            let after = &rest[at + 5..];
            let Some(end) = after.find('"') else { break };
            used.insert(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    for (_, line) in prose {
        let t = line.trim_start();
        let hashes = t.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !t[hashes..].starts_with(' ') {
            continue;
        }
        let id = slug(&heading_text(t[hashes..].trim()));
        if !used.contains(&id) {
            used.insert(id);
            continue;
        }
        let mut n = 1;
        while !used.insert(format!("{id}-{n}")) {
            n += 1;
        }
    }
    used
}

/// The targets of inline links `[text](target)` in a line, code spans
/// left out.
fn links(line: &str) -> Vec<String> {
    let mut no_code = String::new();
    for (i, part) in line.split('`').enumerate() {
        if i % 2 == 0 {
            no_code.push_str(part);
        }
    }
    let mut out = Vec::new();
    let mut rest = no_code.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        out.push(target.to_owned());
        rest = &after[end..];
    }
    out
}

/// Every relative link of the book and the README leads to a file that
/// exists, and every `#anchor` to a heading of its page (by mdBook's ids,
/// which GitHub's match for these headings).
#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut failures = Vec::new();
    let mut checked = 0;
    let mut page_anchors: HashMap<PathBuf, HashSet<String>> = HashMap::new();
    let mut anchors_of = |p: &Path| -> Option<HashSet<String>> {
        let p = p.canonicalize().ok()?;
        if let Some(a) = page_anchors.get(&p) {
            return Some(a.clone());
        }
        let text = std::fs::read_to_string(&p).ok()?;
        let a = anchors(&parse(&text).1);
        page_anchors.insert(p, a.clone());
        Some(a)
    };
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("read page");
        let dir = page.parent().expect("page dir");
        for (n, line) in parse(&text).1 {
            for target in links(&line) {
                if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                    continue;
                }
                checked += 1;
                let at = format!("{}:{n}: {target}", shown(&page));
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let file = if path.is_empty() {
                    page.clone()
                } else {
                    dir.join(path)
                };
                if !file.exists() {
                    failures.push(format!("{at}: no such file"));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if file.extension().is_none_or(|e| e != "md") {
                    failures.push(format!("{at}: an anchor into a file that is not Markdown"));
                    continue;
                }
                match anchors_of(&file) {
                    Some(a) if a.contains(anchor) => {}
                    Some(a) => {
                        let mut known: Vec<_> = a.into_iter().collect();
                        known.sort();
                        failures.push(format!(
                            "{at}: no heading with this id (has: {})",
                            known.join(", ")
                        ));
                    }
                    None => failures.push(format!("{at}: cannot read")),
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} relative links found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Heading ids are mdBook's: a link to `#rate-limits-global-concurrency-and-429-pauses`
/// finds "## Rate limits, global concurrency and 429 pauses", and a
/// repeated heading gets `-1`; an HTML element's `id` is an anchor too.
#[test]
fn heading_ids_follow_mdbook() {
    let prose = vec![
        (
            1,
            "# Rate limits, global concurrency and 429 pauses".to_owned(),
        ),
        (2, "## `single`".to_owned()),
        (3, "### [RabbitMQ](x.md) over TLS".to_owned()),
        (4, "## single".to_owned()),
        (5, "#not a heading".to_owned()),
        (6, "<a id=\"config-topicconfig\"></a>".to_owned()),
    ];
    let a = anchors(&prose);
    let mut a: Vec<_> = a.into_iter().collect();
    a.sort();
    assert_eq!(
        a,
        [
            "config-topicconfig",
            "rabbitmq-over-tls",
            "rate-limits-global-concurrency-and-429-pauses",
            "single",
            "single-1"
        ]
    );
}
