//! Finds the conformance tests in the suite's source: every `pub async fn`
//! of the `tests` module is one. The build script runs this over
//! `src/tests.rs` and `src/tests/` to generate the list `suite!` expands,
//! so a test cannot be written and left out of the suite.
//!
//! It reads Rust tokens, not lines: comments, string and character literals
//! are skipped, any spacing or line breaks between `pub`, `async`, `fn` and
//! the name are accepted, and `pub(crate) async fn` is not public.

/// The names of the `pub async fn`s in `source`, in the order they appear.
pub fn public_async_fns(source: &str) -> Vec<String> {
    let tokens = tokens(source);
    tokens
        .windows(4)
        .filter(|w| w[0] == "pub" && w[1] == "async" && w[2] == "fn" && is_ident(w[3]))
        .map(|w| w[3].to_owned())
        .collect()
}

fn is_ident(token: &str) -> bool {
    token.starts_with(|c: char| c == '_' || c.is_alphabetic())
}

fn is_ident_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// Identifiers (keywords included) and single punctuation characters, with
/// whitespace, comments and literals left out.
fn tokens(source: &str) -> Vec<&str> {
    let bytes = source.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(c) = source[i..].chars().next() {
        let rest = &source[i..];
        if c.is_whitespace() {
            i += c.len_utf8();
        } else if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += block_comment_len(rest);
        } else if c == '"' {
            i += quoted_len(rest, '"');
        } else if c == '\'' {
            i += char_or_lifetime_len(rest);
        } else if is_ident_char(c) {
            let len = rest.find(|c: char| !is_ident_char(c)).unwrap_or(rest.len());
            let word = &rest[..len];
            i += len;
            let next = &source[i..];
            if word == "r" && next.starts_with('#') && next[1..].starts_with(is_ident_char) {
                // A raw identifier, `r#name`: one token.
                let len = 1 + next[1..]
                    .find(|c: char| !is_ident_char(c))
                    .unwrap_or(next.len() - 1);
                out.push(&rest[..word.len() + len]);
                i += len;
                continue;
            }
            match (word, bytes.get(i)) {
                ("r" | "br" | "cr", Some(b'"' | b'#')) => i += raw_string_len(next),
                ("b" | "c", Some(b'"')) => i += quoted_len(next, '"'),
                ("b", Some(b'\'')) => i += quoted_len(next, '\''),
                _ => out.push(word),
            }
        } else {
            out.push(&rest[..c.len_utf8()]);
            i += c.len_utf8();
        }
    }
    out
}

/// Length of the (possibly nested) block comment `s` starts with.
fn block_comment_len(s: &str) -> usize {
    let mut depth = 0usize;
    let mut i = 0;
    while i < s.len() {
        if s[i..].starts_with("/*") {
            depth += 1;
            i += 2;
        } else if s[i..].starts_with("*/") {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += s[i..].chars().next().map_or(1, char::len_utf8);
        }
    }
    s.len()
}

/// Length of the literal `s` starts with, delimited by `quote`, with
/// backslash escapes.
fn quoted_len(s: &str, quote: char) -> usize {
    let mut chars = s.char_indices().skip(1);
    while let Some((i, c)) = chars.next() {
        if c == '\\' {
            chars.next();
        } else if c == quote {
            return i + c.len_utf8();
        }
    }
    s.len()
}

/// Length of the raw string `s` starts with, after its `r`: `#`s, a quote,
/// the text, a quote and as many `#`s.
fn raw_string_len(s: &str) -> usize {
    let hashes = s.len() - s.trim_start_matches('#').len();
    let closing = format!("\"{}", "#".repeat(hashes));
    let body = hashes + 1;
    s.get(body..)
        .and_then(|rest| rest.find(&closing))
        .map_or(s.len(), |end| body + end + closing.len())
}

/// Length of the character literal `s` starts with, or 1 for the quote of a
/// lifetime (its name is read as an identifier next).
fn char_or_lifetime_len(s: &str) -> usize {
    let mut chars = s.chars().skip(1);
    match (chars.next(), chars.next()) {
        (Some('\\'), _) => quoted_len(s, '\''),
        (Some(c), Some('\'')) => 1 + c.len_utf8() + 1,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::public_async_fns;

    /// Every spelling of a public async function is found, in order: with
    /// doc comments and attributes above it, and split over lines.
    #[test]
    fn finds_every_public_async_fn_however_it_is_laid_out() {
        let source = r#"
/// Does a thing.
pub async fn first(s: S) {}

#[allow(clippy::too_many_lines)]
pub   async
    fn second(s: S) {
    let _ = 'a';
}
pub async fn
third(s: S) {}
"#;
        assert_eq!(public_async_fns(source), ["first", "second", "third"]);
    }

    /// Helpers are not tests: private, crate-visible and non-async functions
    /// are left out.
    #[test]
    fn leaves_out_private_restricted_and_sync_functions() {
        let source = "
async fn helper(s: &S) {}
pub(crate) async fn shared(s: &S) {}
pub(super) async fn parent(s: &S) {}
pub fn event() {}
fn req() {}
pub async fn the_test(s: S) {}
";
        assert_eq!(public_async_fns(source), ["the_test"]);
    }

    /// Text that only looks like a test (in comments, strings, characters
    /// and raw strings) is not one, what follows it still counts, and a
    /// test named with a raw identifier is found under that name.
    #[test]
    fn ignores_comments_and_literals() {
        let source = r###"
// pub async fn in_a_line_comment(s: S) {}
/* pub async fn in_a_block /* nested */ pub async fn still_in_it(s: S) {} */
fn f<'a>(x: &'a str) -> char {
    let _ = "pub async fn in_a_string(s: S) {} \" pub async fn after_an_escape";
    let _ = r#"pub async fn in_a_raw_string "quoted" (s: S) {}"#;
    let _ = b"pub async fn in_bytes";
    let _ = '"';
    let _ = '\'';
    '\u{22}'
}
pub async fn r#match(s: S) {}
pub async fn the_test(s: S) {}
"###;
        assert_eq!(public_async_fns(source), ["r#match", "the_test"]);
    }
}
