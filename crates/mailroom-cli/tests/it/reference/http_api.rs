//! `reference/http-api.md`, from the OpenAPI document the server serves at
//! `GET /openapi.json`, asked of the real router in-process.

use super::markdown::{anchor, cell, one_line, table};
use axum::body::Body;
use http::Request;
use serde_json::{Map, Value};
use tower::ServiceExt;

/// The document, as `GET /openapi.json` answers it.
async fn document() -> Value {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    let store = mailroom::open_store(&url, true)
        .await
        .expect("the store opens");
    store.migrate().await.expect("the schema is created");
    let engine = mailroom::Engine::builder(store)
        .build()
        .expect("the engine builds");
    // With an API token: the document describes the instance serving it, and
    // a token-less one (loopback only) requires no authentication.
    let options = mailroom_server::ServerOptions {
        api_tokens: vec!["reference-page-token-0123456789abcdef".into()],
        ..mailroom_server::ServerOptions::default()
    };
    let router = mailroom_server::router(engine, options);
    let request = Request::get("/openapi.json")
        .body(Body::empty())
        .expect("a request");
    let response = router.oneshot(request).await.expect("an answer");
    assert_eq!(response.status(), 200, "GET /openapi.json");
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("the body");
    serde_json::from_slice(&body).expect("the document is JSON")
}

/// The HTTP methods an OpenAPI path item may hold, in page order.
const METHODS: [&str; 7] = ["get", "post", "put", "patch", "delete", "head", "options"];

/// The page.
pub async fn render() -> String {
    let doc = document().await;
    let mut out =
        super::generated_note("the OpenAPI document the server serves at `GET /openapi.json`");
    out.push_str("\n# HTTP API\n\n");
    if let Some(d) = doc.pointer("/info/description").and_then(Value::as_str) {
        out.push_str(&format!("{}\n\n", one_line(d)));
    }
    out.push_str(&format!(
        "The server describes itself at `GET /openapi.json` (OpenAPI {}); \
         this page is that document, route by route.\n\n",
        doc["openapi"].as_str().unwrap_or("3.1")
    ));
    security_schemes(&mut out, &doc);
    let operations = operations(&doc);
    out.push_str("## Routes\n\n");
    let rows: Vec<Vec<String>> = operations
        .iter()
        .map(|op| {
            vec![
                format!(
                    "[`{} {}`](#{})",
                    op.method.to_uppercase(),
                    op.path,
                    op.anchor()
                ),
                cell(op.summary()),
                auth(&doc, op.operation),
            ]
        })
        .collect();
    table(&mut out, &["route", "what it does", "auth"], &rows);
    let mut tag = None;
    for op in &operations {
        let this_tag = op.operation["tags"][0].as_str().unwrap_or("other");
        if tag != Some(this_tag) {
            tag = Some(this_tag);
            out.push_str(&format!("## {}\n\n", tag_title(&doc, this_tag)));
        }
        operation(&mut out, &doc, op);
    }
    schemas(&mut out, &doc);
    out
}

/// One operation of the document.
struct Op<'a> {
    path: &'a str,
    method: &'a str,
    operation: &'a Value,
}

impl Op<'_> {
    fn anchor(&self) -> String {
        let path: String = self
            .path
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        format!("{}{}", self.method, path.trim_end_matches('-'))
    }

    fn summary(&self) -> &str {
        self.operation["summary"]
            .as_str()
            .or(self.operation["description"].as_str())
            .unwrap_or("")
    }
}

/// Every operation, grouped by first tag (in the document's tag order, then
/// by name), then by path and method.
fn operations(doc: &Value) -> Vec<Op<'_>> {
    let mut ops = Vec::new();
    if let Some(paths) = doc["paths"].as_object() {
        for (path, item) in paths {
            for method in METHODS {
                if let Some(operation) = item.get(method) {
                    ops.push(Op {
                        path,
                        method,
                        operation,
                    });
                }
            }
        }
    }
    let tag_order: Vec<&str> = doc["tags"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["name"].as_str()).collect())
        .unwrap_or_default();
    let rank = |op: &Op| {
        let tag = op.operation["tags"][0].as_str().unwrap_or("other");
        let index = tag_order
            .iter()
            .position(|t| *t == tag)
            .unwrap_or(usize::MAX);
        (index, tag.to_owned())
    };
    ops.sort_by(|a, b| {
        rank(a)
            .cmp(&rank(b))
            .then(a.path.cmp(b.path))
            .then(method_rank(a.method).cmp(&method_rank(b.method)))
    });
    ops
}

fn method_rank(method: &str) -> usize {
    METHODS
        .iter()
        .position(|m| *m == method)
        .unwrap_or(usize::MAX)
}

fn tag_title(doc: &Value, tag: &str) -> String {
    let description = doc["tags"].as_array().and_then(|tags| {
        tags.iter()
            .find(|t| t["name"] == tag)
            .and_then(|t| t["description"].as_str())
    });
    match description {
        Some(d) => format!("`{tag}`: {}", one_line(d)),
        None => format!("`{tag}`"),
    }
}

/// `components.securitySchemes`, described.
fn security_schemes(out: &mut String, doc: &Value) {
    let Some(schemes) = doc
        .pointer("/components/securitySchemes")
        .and_then(Value::as_object)
    else {
        return;
    };
    out.push_str("## Authentication\n\n");
    for (name, scheme) in schemes {
        let how = match (scheme["type"].as_str(), scheme["scheme"].as_str()) {
            (Some("http"), Some("bearer")) => "`Authorization: Bearer <token>`".to_owned(),
            (Some("http"), Some(s)) => format!("HTTP `{s}` authentication"),
            (Some("apiKey"), _) => format!(
                "an API key in the {} `{}`",
                scheme["in"].as_str().unwrap_or("header"),
                scheme["name"].as_str().unwrap_or("")
            ),
            (Some(t), _) => format!("`{t}`"),
            (None, _) => "unspecified".to_owned(),
        };
        let description = scheme["description"]
            .as_str()
            .map(one_line)
            .unwrap_or_default();
        out.push_str(&format!("- `{name}`: {how}. {description}\n").replace(". \n", ".\n"));
    }
    out.push_str(
        "\nRoutes marked with a scheme need it once the server has a token configured \
         (`api_token`); the others are open.\n\n",
    );
}

/// The operation's security requirement, or the document's default.
fn auth(doc: &Value, operation: &Value) -> String {
    let requirements = operation.get("security").or(doc.get("security"));
    let names: Vec<String> = requirements
        .and_then(Value::as_array)
        .map(|reqs| {
            reqs.iter()
                .filter_map(Value::as_object)
                .map(|r| {
                    if r.is_empty() {
                        "none".to_owned()
                    } else {
                        r.keys()
                            .map(|k| format!("`{k}`"))
                            .collect::<Vec<_>>()
                            .join(" and ")
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(" or ")
    }
}

fn operation(out: &mut String, doc: &Value, op: &Op) {
    out.push_str(&anchor(&op.anchor()));
    out.push_str(&format!(
        "### `{} {}`\n\n",
        op.method.to_uppercase(),
        op.path
    ));
    let o = op.operation;
    if let Some(s) = o["summary"].as_str() {
        out.push_str(&format!("{}\n\n", one_line(s)));
    }
    if let Some(d) = o["description"].as_str() {
        if Some(d) != o["summary"].as_str() {
            out.push_str(&format!("{}\n\n", one_line(d)));
        }
    }
    out.push_str(&format!("Auth: {}.", auth(doc, o)));
    if o["deprecated"] == true {
        out.push_str(" Deprecated.");
    }
    out.push_str("\n\n");
    if let Some(params) = o["parameters"].as_array().filter(|p| !p.is_empty()) {
        let rows: Vec<Vec<String>> = params
            .iter()
            .map(|p| resolve(doc, p))
            .map(|p| {
                let schema = p.get("schema").cloned().unwrap_or(Value::Null);
                vec![
                    format!("`{}`", p["name"].as_str().unwrap_or("?")),
                    p["in"].as_str().unwrap_or("?").to_owned(),
                    type_of(&schema),
                    if p["required"] == true { "yes" } else { "no" }.to_owned(),
                    cell(p["description"].as_str().unwrap_or("")),
                ]
            })
            .collect();
        out.push_str("Parameters:\n\n");
        table(
            out,
            &["name", "in", "type", "required", "description"],
            &rows,
        );
    }
    if let Some(body) = o.get("requestBody").map(|b| resolve(doc, b)) {
        let required = if body["required"] == true {
            "required"
        } else {
            "optional"
        };
        out.push_str(&format!("Request body ({required}):"));
        if let Some(d) = body["description"].as_str() {
            out.push_str(&format!(" {}", one_line(d)));
        }
        out.push_str("\n\n");
        let rows = contents(&body["content"]);
        table(out, &["content type", "schema"], &rows);
    }
    if let Some(responses) = o["responses"].as_object() {
        out.push_str("Responses:\n\n");
        let mut rows = Vec::new();
        for (status, response) in responses {
            let response = resolve(doc, response);
            let content = contents(&response["content"]);
            let (types, schemas): (Vec<String>, Vec<String>) = content
                .into_iter()
                .map(|row| (row[0].clone(), row[1].clone()))
                .unzip();
            rows.push(vec![
                format!("`{status}`"),
                cell(response["description"].as_str().unwrap_or("")),
                types.join(", "),
                schemas.join(", "),
            ]);
        }
        table(out, &["status", "meaning", "content type", "body"], &rows);
    }
}

/// (content type, schema) rows of a `content` map.
fn contents(content: &Value) -> Vec<Vec<String>> {
    content
        .as_object()
        .map(|c| {
            c.iter()
                .map(|(ctype, media)| {
                    let schema = media.get("schema").cloned().unwrap_or(Value::Null);
                    vec![format!("`{ctype}`"), type_of(&schema)]
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `value`, or what its `$ref` points at.
fn resolve<'a>(doc: &'a Value, value: &'a Value) -> &'a Value {
    match value["$ref"].as_str().and_then(|r| r.strip_prefix('#')) {
        Some(pointer) => doc.pointer(pointer).unwrap_or(value),
        None => value,
    }
}

/// A schema name's anchor in the Schemas section.
fn schema_anchor(name: &str) -> String {
    format!("schema-{}", name.to_ascii_lowercase())
}

/// A schema, in words: a link for a named one, the type otherwise.
fn type_of(schema: &Value) -> String {
    if schema.is_null() {
        return String::new();
    }
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.rsplit('/').next().unwrap_or(r);
        return format!("[`{name}`](#{})", schema_anchor(name));
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(options) = schema[key].as_array() {
            let parts: Vec<String> = options
                .iter()
                .filter(|o| o["type"] != "null")
                .map(type_of)
                .collect();
            return parts.join(" or ");
        }
    }
    if let Some(all) = schema["allOf"].as_array() {
        return all.iter().map(type_of).collect::<Vec<_>>().join(" and ");
    }
    if let Some(values) = schema["enum"].as_array() {
        return values
            .iter()
            .map(|v| {
                format!(
                    "`{}`",
                    v.as_str()
                        .map(str::to_owned)
                        .unwrap_or_else(|| v.to_string())
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
    }
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts
            .iter()
            .filter_map(Value::as_str)
            .filter(|t| *t != "null")
            .collect(),
        _ => vec![],
    };
    let mut words: Vec<String> = types
        .iter()
        .map(|t| match *t {
            "array" => format!("array of {}", type_of(&schema["items"])),
            "object"
                if schema
                    .get("additionalProperties")
                    .is_some_and(Value::is_object) =>
            {
                format!("map of {}", type_of(&schema["additionalProperties"]))
            }
            other => other.to_owned(),
        })
        .collect();
    if words.is_empty() {
        words.push("any".to_owned());
    }
    let mut text = words.join(" or ");
    if let Some(format) = schema["format"].as_str() {
        text.push_str(&format!(" ({format})"));
    }
    text
}

/// `components.schemas`: each named schema with its properties.
fn schemas(out: &mut String, doc: &Value) {
    let Some(schemas) = doc
        .pointer("/components/schemas")
        .and_then(Value::as_object)
    else {
        return;
    };
    out.push_str("## Schemas\n\n");
    for (name, schema) in schemas {
        out.push_str(&anchor(&schema_anchor(name)));
        out.push_str(&format!("### `{name}`\n\n"));
        if let Some(d) = schema["description"].as_str() {
            out.push_str(&format!("{}\n\n", one_line(d)));
        }
        object(out, doc, schema);
    }
}

/// The properties of an object schema (and of each `allOf`/`oneOf` part).
fn object(out: &mut String, doc: &Value, schema: &Value) {
    let empty = Map::new();
    if let Some(props) = schema["properties"].as_object() {
        let required: Vec<&str> = schema["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let rows: Vec<Vec<String>> = props
            .iter()
            .map(|(key, prop)| {
                let description = prop["description"]
                    .as_str()
                    .or_else(|| resolve(doc, prop)["description"].as_str())
                    .unwrap_or("");
                vec![
                    format!("`{key}`"),
                    type_of(prop),
                    if required.contains(&key.as_str()) {
                        "yes"
                    } else {
                        "no"
                    }
                    .to_owned(),
                    cell(description),
                ]
            })
            .collect();
        table(out, &["field", "type", "required", "description"], &rows);
    } else if schema.as_object().unwrap_or(&empty).contains_key("allOf")
        || schema.get("oneOf").is_some()
        || schema.get("anyOf").is_some()
    {
        for key in ["allOf", "oneOf", "anyOf"] {
            if let Some(parts) = schema[key].as_array() {
                let word = match key {
                    "allOf" => "All of:",
                    "oneOf" => "One of:",
                    _ => "Any of:",
                };
                out.push_str(&format!("{word}\n\n"));
                for part in parts {
                    if part.get("properties").is_some() {
                        if let Some(d) = part["description"].as_str() {
                            out.push_str(&format!("{}\n\n", one_line(d)));
                        }
                        object(out, doc, part);
                    } else {
                        out.push_str(&format!("- {}\n", type_of(part)));
                    }
                }
                out.push('\n');
            }
        }
    } else {
        out.push_str(&format!("Type: {}.\n\n", type_of(schema)));
    }
}
