//! Strings holding `${VAR}` or `${file:PATH}` in the configuration's JSON
//! Schema: such a string is accepted wherever a formatted string or a name
//! is expected, as what it becomes is only known when the file is loaded.

use schemars::Schema;
use serde_json::{Map, Value};

/// What a string holding `${VAR}` or `${file:PATH}` matches.
pub(crate) const INTERPOLATED: &str = r"\$\{";

/// Makes a derived enum of names also accept an interpolated string
/// (`#[schemars(transform = ...)]` on the enums the file names by string).
pub(crate) fn or_interpolated(schema: &mut Schema) {
    let Some(map) = schema.as_object_mut() else {
        return;
    };
    let description = map.remove("description");
    let names: Map<String, Value> = std::mem::take(map);
    map.insert(
        "anyOf".into(),
        serde_json::json!([names, { "type": "string", "pattern": INTERPOLATED }]),
    );
    if let Some(d) = description {
        map.insert("description".into(), d);
    }
}
