//! What may be shown of configured and received text: URLs without their
//! secrets, and text without control characters.
//!
//! Every place that names a URL to a person or a log (store, broker and
//! handler URLs in `config check`, `status`, errors, logs, stored attempt
//! errors, metric labels, `/readyz`) goes through [`url`], so a password or
//! a token in a query string is never shown. Values that may come from a
//! sender (keys, types, error text of a receiver) are printed through
//! [`escape_controls`], so they cannot move a terminal's cursor or forge a
//! line of a log.

/// What replaces a secret.
pub const MASK: &str = "***";

/// `raw` without what may be a secret: its user info (user and password;
/// a user alone may be a token) is left out, each query value becomes
/// `***` (`?sslmode=***&token=***`) and the fragment is dropped:
/// `postgres://mailroom:pw@db/mailroom?password=pw` is shown as
/// `postgres://db/mailroom?password=***`. Scheme, host, port and path stay,
/// which is what an operator needs to recognise the URL. Text that is not
/// a URL is returned with the same rules applied to whatever parts it has.
pub fn url(raw: &str) -> String {
    let (scheme, rest) = match raw.split_once("://") {
        Some((s, r)) if is_scheme(s) => (Some(s), r),
        _ => (None, raw),
    };
    let mut out = String::with_capacity(raw.len());
    let mut rest = rest;
    if let Some(s) = scheme {
        out.push_str(s);
        out.push_str("://");
        if let Some(at) = userinfo_end(rest) {
            rest = &rest[at + 1..];
        }
    }
    let rest = rest.split_once('#').map_or(rest, |(r, _)| r);
    match rest.split_once('?') {
        None => out.push_str(rest),
        Some((path, query)) => {
            out.push_str(path);
            if !query.is_empty() {
                out.push('?');
                let masked: Vec<String> = query
                    .split('&')
                    .map(|pair| match pair.split_once('=') {
                        Some((k, _)) => format!("{k}={MASK}"),
                        None => MASK.to_owned(),
                    })
                    .collect();
                out.push_str(&masked.join("&"));
            }
        }
    }
    out
}

/// RFC 3986 §3.1: `ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )`.
fn is_scheme(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// Where the user info of `rest` (what follows `scheme://`) ends: the last
/// `@` of the authority (RFC 3986 §3.2). A password holding an unencoded
/// `/`, `?` or `#` makes the URL invalid, but people write them; then the
/// authority's "port" is not a number, and the last `@` of the whole text
/// is taken instead, which may hide too much but never too little.
fn userinfo_end(rest: &str) -> Option<usize> {
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    if let Some(at) = authority.rfind('@') {
        return Some(at);
    }
    let port = match authority.strip_prefix('[') {
        // An IPv6 literal's colons are inside its brackets.
        Some(v6) => v6.split_once("]:").map_or("", |(_, port)| port),
        None => authority.rsplit_once(':').map_or("", |(_, port)| port),
    };
    let port_is_valid = port.chars().all(|c| c.is_ascii_digit());
    if port_is_valid { None } else { rest.rfind('@') }
}

/// Whether `c` is a control character: C0 (U+0000–U+001F, with tab, CR, LF,
/// NUL and ESC), DEL (U+007F) or C1 (U+0080–U+009F).
pub fn is_control(c: char) -> bool {
    c.is_control()
}

/// `s` with each control character ([`is_control`]) written as a Rust-style
/// escape (`\n`, `\r`, `\t`, `\0`, `\u{1b}`), so that it prints on one line
/// and cannot drive a terminal. Backslashes are left alone: the result is
/// for reading, not for parsing back.
pub fn escape_controls(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(is_control) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\0' => out.push_str("\\0"),
            c if is_control(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// User info (passwords, users that may be tokens) is left out and query
    /// values are masked; scheme, host, port and path stay.
    #[test]
    fn urls_lose_their_secrets() {
        for (raw, shown) in [
            (
                "http://admin:DBPASS42@127.0.0.1:1/x?token=QS2",
                "http://127.0.0.1:1/x?token=***",
            ),
            ("https://TOKEN@hooks.example/in", "https://hooks.example/in"),
            (
                "postgres://mailroom:PGPASSWORD123@127.0.0.1:1/mailroom",
                "postgres://127.0.0.1:1/mailroom",
            ),
            (
                "postgres://h/db?password=secret&sslmode=require",
                "postgres://h/db?password=***&sslmode=***",
            ),
            (
                "amqp://guest:secret@rabbit:5672/%2f",
                "amqp://rabbit:5672/%2f",
            ),
            ("amqp://rabbit/%2f", "amqp://rabbit/%2f"),
            ("http://h/p#frag", "http://h/p"),
            ("http://[::1]:8080/x", "http://[::1]:8080/x"),
            ("http://h/x?email=a@b.example", "http://h/x?email=***"),
            ("sqlite://mailroom.db", "sqlite://mailroom.db"),
            ("sqlite:mailroom.db?mode=rwc", "sqlite:mailroom.db?mode=***"),
        ] {
            assert_eq!(url(raw), shown, "{raw}");
        }
    }

    /// A password with unencoded `/`, `?` or `#` (an invalid URL that a
    /// store may still be given, and whose error names it) is hidden too.
    #[test]
    fn invalid_passwords_are_hidden_too() {
        for raw in [
            "postgres://u:pa/ss@h:5432/db",
            "postgres://u:pa?ss@h:5432/db",
            "postgres://u:pa#ss@h:5432/db",
        ] {
            let shown = url(raw);
            assert!(!shown.contains("pa"), "{raw} -> {shown}");
            assert!(shown.contains("h:5432"), "{raw} -> {shown}");
        }
    }

    /// C0 (CR, LF, NUL, ESC), DEL and C1 are escaped; other text is kept.
    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(
            escape_controls("k\r\nX-Evil: 1\0\u{1b}[31m\u{7f}\u{9b}é"),
            "k\\r\\nX-Evil: 1\\0\\u{1b}[31m\\u{7f}\\u{9b}é"
        );
        assert!(matches!(
            escape_controls("plain"),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}
