//! Markdown pieces shared by the page generators.

/// Text for one table cell: on one line, with `|` escaped.
pub fn cell(text: &str) -> String {
    one_line(text).replace('|', "\\|")
}

/// Paragraph text on one line (doc comments wrap at 80 columns), with
/// `<` outside code spans written so it is not read as an HTML tag.
pub fn one_line(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = String::with_capacity(joined.len());
    let mut in_code = false;
    for c in joined.chars() {
        match c {
            '`' => {
                in_code = !in_code;
                out.push(c);
            }
            '<' if !in_code => out.push_str("&lt;"),
            _ => out.push(c),
        }
    }
    out
}

/// A table with `header` and `rows`, each cell already escaped.
pub fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    out.push_str(&format!("| {} |\n", header.join(" | ")));
    out.push_str(&format!("|{}\n", " --- |".repeat(header.len())));
    for row in rows {
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    out.push('\n');
}

/// An HTML anchor mdBook keeps, for links into generated sections.
pub fn anchor(id: &str) -> String {
    format!("<a id=\"{id}\"></a>\n\n")
}
