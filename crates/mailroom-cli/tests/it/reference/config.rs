//! `reference/configuration.md`, from the JSON Schema that
//! `mailroom config schema` prints (`mailroom_config::schema::schema`).

use super::markdown::{anchor, cell, one_line, table};
use serde_json::{Map, Value};

/// The `$defs` described in "Value formats" rather than inline.
const FORMATS: [&str; 4] = ["Duration", "ByteSize", "Rate", "RequestRate"];

/// The page.
pub fn render() -> String {
    let schema = mailroom_config::schema::schema();
    let mut out = super::generated_note(
        "the JSON Schema of the configuration file (`mailroom config schema`), itself derived from the file's types in `crates/mailroom-config`",
    );
    out.push_str(
        "\n# Configuration\n\n\
         mailroom reads one TOML file: `--config FILE`, else `$MAILROOM_CONFIG`, else \
         `./mailroom.toml` if present; without one it runs on built-in defaults (SQLite in \
         the working directory, a listener on `127.0.0.1:8080`). Unknown keys are refused, \
         and every error names the file and the key (`topic[0].retry.base`). \
         `mailroom config check` validates a file without starting anything. The \
         repository's `mailroom.example.toml` shows every section with comments.\n\n\
         Every string value may use `${VAR}` (an environment variable; a missing one is an \
         error naming the key) and `${file:PATH}` (a file's contents less one trailing \
         newline, for mounted secrets); `$$` is a literal `$`. `MAILROOM_LISTEN`, \
         `MAILROOM_STORE_URL` and `MAILROOM_API_TOKEN` override `listen`, `[store] url` \
         and `api_token`.\n\n",
    );
    out.push_str(&format!(
        "## Schema and editor support\n\n\
         `mailroom config schema` prints the JSON Schema (dialect `{}`) of the file: \
         every key with its type, default, allowed values and description. Editors that \
         use taplo (Even Better TOML in VS Code, Zed, Helix, Neovim through `taplo lsp`) \
         then complete and check `mailroom.toml` as it is typed:\n\n\
         ```sh\nmailroom config schema > mailroom.schema.json\n```\n\n\
         Either name the schema on the file's first line,\n\n\
         ```toml\n#:schema ./mailroom.schema.json\nlisten = \"127.0.0.1:8080\"\n```\n\n\
         or associate it in a `.taplo.toml` beside the file:\n\n\
         ```toml,fragment\n[[rule]]\ninclude = [\"**/mailroom.toml\"]\nschema = {{ path = \"./mailroom.schema.json\" }}\n```\n\n\
         The schema accepts what the loader reads: a string holding `${{` is accepted \
         wherever a formatted value is expected, since what it becomes is only known when \
         the file is loaded. Some rules hold between keys and are checked only by the \
         loader (`mailroom config check`): a `verify` scheme's secret, a batch topic's \
         settings, a non-loopback `listen` that needs a strong `api_token`.\n\n",
        schema["$schema"].as_str().unwrap_or("")
    ));
    let defs = schema["$defs"].as_object().cloned().unwrap_or_default();
    let sections = sections(&schema, &defs);
    for section in &sections {
        out.push_str(&anchor(&def_anchor(&section.def)));
        out.push_str(&format!("## {}\n\n", section.title()));
        let def = if section.def.is_empty() {
            &schema
        } else {
            &defs[&section.def]
        };
        // A description that only repeats the heading (`[[topic]]`.) is left out.
        let description = def["description"]
            .as_str()
            .map(|d| one_line(&plain_links(d)));
        if let Some(d) = description.filter(|d| {
            let bare = d.trim_end_matches('.');
            !section.places.iter().any(|p| bare == format!("`{p}`"))
        }) {
            out.push_str(&format!("{d}\n\n"));
        }
        keys(&mut out, def, &defs);
    }
    out.push_str("## Value formats\n\n");
    for name in FORMATS {
        if let Some(def) = defs.get(name) {
            out.push_str(&anchor(&format_anchor(name)));
            out.push_str(&format!(
                "- **{}**: {}\n",
                format_word(name),
                one_line(def["description"].as_str().unwrap_or(""))
            ));
        }
    }
    out.push('\n');
    out
}

/// A table of the file: `[store]`, `[[source]]`, `[[topic]] retry`.
struct Section {
    /// The `$defs` name; empty for the top level.
    def: String,
    /// Where it appears.
    places: Vec<String>,
}

impl Section {
    fn title(&self) -> String {
        if self.def.is_empty() {
            return "Top level".to_owned();
        }
        self.places
            .iter()
            .map(|p| format!("`{p}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Every table of the file, depth first from the top level, each `$defs`
/// object once with every place it appears.
fn sections(root: &Value, defs: &Map<String, Value>) -> Vec<Section> {
    let mut out = vec![Section {
        def: String::new(),
        places: vec![],
    }];
    walk(root, defs, &Place::Root, &mut out);
    out
}

/// Where a table sits: the top level, a `[header]` / `[[header]]`, or an
/// inline table under a key of an array-of-tables entry.
enum Place {
    Root,
    Table(String),
    Array(String),
    Inline(String, String),
}

impl Place {
    /// The place of a key `key` of this table holding a table (`array`: an
    /// array of tables).
    fn child(&self, key: &str, array: bool) -> Place {
        match self {
            Place::Root if array => Place::Array(key.to_owned()),
            Place::Root => Place::Table(key.to_owned()),
            Place::Table(h) if array => Place::Array(format!("{h}.{key}")),
            Place::Table(h) => Place::Table(format!("{h}.{key}")),
            Place::Array(h) => Place::Inline(format!("[[{h}]]"), key.to_owned()),
            Place::Inline(h, path) => Place::Inline(h.clone(), format!("{path}.{key}")),
        }
    }

    fn label(&self) -> String {
        match self {
            Place::Root => String::new(),
            Place::Table(h) => format!("[{h}]"),
            Place::Array(h) => format!("[[{h}]]"),
            Place::Inline(h, path) => format!("{h} {path}"),
        }
    }
}

fn walk(table: &Value, defs: &Map<String, Value>, place: &Place, out: &mut Vec<Section>) {
    let Some(props) = table["properties"].as_object() else {
        return;
    };
    for (key, prop) in props {
        for (name, array) in tables_in(prop, defs) {
            let child = place.child(key, array);
            if let Some(s) = out.iter_mut().find(|s| s.def == name) {
                if !s.places.contains(&child.label()) {
                    s.places.push(child.label());
                }
                continue;
            }
            out.push(Section {
                def: name.clone(),
                places: vec![child.label()],
            });
            walk(&defs[&name], defs, &child, out);
        }
    }
}

/// The `$defs` tables a key holds: (name, whether as an array of them).
fn tables_in(schema: &Value, defs: &Map<String, Value>) -> Vec<(String, bool)> {
    let mut found = Vec::new();
    if let Some(name) = ref_name(schema) {
        match defs.get(name) {
            Some(def) if def.get("properties").is_some() => found.push((name.to_owned(), false)),
            Some(def) => found.extend(tables_in(def, defs)),
            None => {}
        }
    }
    if schema["type"] == "array" {
        if let Some(name) = ref_name(&schema["items"]) {
            if defs
                .get(name)
                .is_some_and(|d| d.get("properties").is_some())
            {
                found.push((name.to_owned(), true));
            }
        }
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(options) = schema[key].as_array() {
            for o in options {
                found.extend(tables_in(o, defs));
            }
        }
    }
    found
}

fn ref_name(schema: &Value) -> Option<&str> {
    schema["$ref"].as_str()?.strip_prefix("#/$defs/")
}

fn def_anchor(def: &str) -> String {
    if def.is_empty() {
        "config-top-level".to_owned()
    } else {
        format!("config-{}", def.to_ascii_lowercase())
    }
}

fn format_anchor(name: &str) -> String {
    format!("format-{}", name.to_ascii_lowercase())
}

fn format_word(name: &str) -> &'static str {
    match name {
        "Duration" => "duration",
        "ByteSize" => "byte size",
        "Rate" => "rate",
        _ => "request rate",
    }
}

/// The table of a section's keys.
fn keys(out: &mut String, table: &Value, defs: &Map<String, Value>) {
    let Some(props) = table["properties"].as_object() else {
        return;
    };
    let required: Vec<&str> = table["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut props: Vec<(&String, &Value)> = props.iter().collect();
    props.sort_by_key(|(key, _)| !required.contains(&key.as_str()));
    let rows: Vec<Vec<String>> = props
        .into_iter()
        .map(|(key, prop)| {
            let default = if required.contains(&key.as_str()) {
                "required".to_owned()
            } else {
                prop.get("default").map(toml_value).unwrap_or_default()
            };
            let description = prop["description"]
                .as_str()
                .or_else(|| ref_name(prop).and_then(|n| defs[n]["description"].as_str()))
                .unwrap_or("");
            vec![
                format!("`{key}`"),
                type_of(prop, defs),
                cell(&default),
                cell(&plain_links(description)),
            ]
        })
        .collect();
    table_rows(out, rows);
}

fn table_rows(out: &mut String, rows: Vec<Vec<String>>) {
    table(out, &["key", "type", "default", "description"], &rows);
}

/// A default, as it would be written in the file.
fn toml_value(value: &Value) -> String {
    match value {
        Value::String(s) => format!("`{s:?}`"),
        Value::Number(n) => format!("`{n}`"),
        Value::Bool(b) => format!("`{b}`"),
        Value::Array(items) if items.is_empty() => "`[]`".to_owned(),
        Value::Array(items) => {
            let inner: Vec<String> = items
                .iter()
                .map(|i| toml_value(i).trim_matches('`').to_owned())
                .collect();
            format!("`[{}]`", inner.join(", "))
        }
        // A table's defaults are its keys' own.
        Value::Object(map) if map.is_empty() => "`{}`".to_owned(),
        Value::Object(_) | Value::Null => String::new(),
    }
}

/// A key's type in words, linking tables and value formats.
fn type_of(schema: &Value, defs: &Map<String, Value>) -> String {
    if let Some(name) = ref_name(schema) {
        let Some(def) = defs.get(name) else {
            return format!("`{name}`");
        };
        if def.get("properties").is_some() {
            return format!("[table](#{})", def_anchor(name));
        }
        if FORMATS.contains(&name) {
            return format!("[{}](#{})", format_word(name), format_anchor(name));
        }
        return type_of(def, defs);
    }
    if let Some(values) = schema["enum"].as_array() {
        return format!("one of {}", names(values));
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(options) = schema[key].as_array() {
            let options: Vec<&Value> = options.iter().filter(|o| !only_interpolation(o)).collect();
            let consts: Vec<Value> = options
                .iter()
                .filter_map(|o| o.get("const").cloned())
                .collect();
            if !consts.is_empty() && consts.len() == options.len() {
                return format!("one of {}", names(&consts));
            }
            return options
                .iter()
                .map(|o| type_of(o, defs))
                .collect::<Vec<_>>()
                .join(" or ");
        }
    }
    match schema["type"].as_str() {
        Some("array") => {
            let item = type_of(&schema["items"], defs);
            match item.strip_prefix("[table]") {
                Some(link) => format!("[array of tables]{link}"),
                None => format!("array of {item}"),
            }
        }
        Some("object") => match schema.get("additionalProperties") {
            Some(v) if v.is_object() => format!("table of {}", type_of(v, defs)),
            _ => "table".to_owned(),
        },
        Some(t) => t.to_owned(),
        None => "any".to_owned(),
    }
}

/// `{ "type": "string", "pattern": "\$\{" }`: the interpolation branch.
fn only_interpolation(schema: &Value) -> bool {
    schema["pattern"].as_str() == Some(r"\$\{") && schema.get("enum").is_none()
}

fn names(values: &[Value]) -> String {
    values
        .iter()
        .map(|v| match v {
            Value::String(s) => format!("`{s}`"),
            other => format!("`{other}`"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Rustdoc's links in doc comments (`` [`Retention::default`] ``,
/// `` [`AlertRules`](mailroom_core::AlertRules) ``) as plain code: their
/// targets are Rust paths, not pages of this book.
fn plain_links(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("[`") {
        let Some(len) = rest[start..].find("`]") else {
            break;
        };
        out.push_str(&rest[..start]);
        let code = &rest[start + 1..start + len + 1];
        out.push_str(code);
        rest = &rest[start + len + 2..];
        if let Some(target) = rest.strip_prefix('(') {
            if let Some(end) = target.find(')') {
                if !target[..end].contains("://") && !target[..end].starts_with('#') {
                    rest = &target[end + 1..];
                }
            }
        }
    }
    out.push_str(rest);
    out
}
