//! Plain aligned text tables for the terminal. Values may come from
//! senders (keys, types, error text), so their control characters are
//! printed escaped (`\n`, `\u{1b}`): they cannot break a row or drive the
//! terminal.

use mailroom::redact::escape_controls;

/// Renders `rows` under `headers`, columns padded to their widest cell,
/// each cell's control characters escaped.
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            row.iter()
                .map(|c| escape_controls(c).into_owned())
                .collect()
        })
        .collect();
    let rows = &rows;
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        s.trim_end().to_string()
    };
    let mut out = line(headers.to_vec());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

/// Shortens `s` to `max` characters with an ellipsis, on one line: line
/// breaks become spaces, other control characters are escaped.
pub fn clip(s: &str, max: usize) -> String {
    let one_line = escape_controls(&s.replace('\n', " ")).into_owned();
    if one_line.chars().count() <= max {
        one_line
    } else {
        let mut t: String = one_line.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored key or type with ESC, CR or LF prints escaped on its own row:
    /// it neither recolours the terminal nor adds a line.
    #[test]
    fn control_characters_in_cells_are_escaped() {
        let out = render(
            &["key", "type"],
            &[vec!["k\u{1b}[31m".into(), "t\r\nforged row\u{9b}".into()]],
        );
        assert!(out.chars().all(|c| c == '\n' || !c.is_control()), "{out:?}");
        assert_eq!(out.lines().count(), 2, "{out:?}");
        assert!(out.contains("k\\u{1b}[31m"), "{out:?}");
        assert!(out.contains("t\\r\\nforged row\\u{9b}"), "{out:?}");
        assert_eq!(clip("a\nb\u{7}", 10), "a b\\u{7}");
    }
}
