//! `GET /openapi.json`: the API described, OpenAPI 3.1.
//!
//! The document is built from the same `#[utoipa::path]` attributes that
//! route the requests (utoipa-axum's `routes!` takes each handler's path and
//! method from its attribute), and its schemas from the typed answers in
//! `mailroom::answer` and the request body types, so a route cannot be
//! served under another path than documented. A test
//! (`openapi::every_served_route_is_documented`) compares the router's own
//! route table with the document, for routes added any other way.
//!
//! [`finish`] adds what no single handler knows: the title, the bearer
//! scheme on `/v1/*` (with its 401) and the problem+json error answer on
//! every operation.

use crate::problem::ProblemBody;
use axum::Extension;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, header};
use std::sync::Arc;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::Operation;
use utoipa::openapi::schema::{AllOfBuilder, AnyOfBuilder, ObjectBuilder, Type};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, InfoBuilder, OpenApi, Ref, RefOr, ResponseBuilder, Schema};
use utoipa::{PartialSchema, ToSchema};

/// The name of the bearer scheme in `components.securitySchemes`.
const BEARER: &str = "bearer";
/// The name of the error answer in `components.responses`.
const PROBLEM: &str = "Problem";
/// The name of the 401 answer of `/v1/*`.
const UNAUTHORIZED: &str = "Unauthorized";

/// The serialized document, shared by every request.
#[derive(Clone, Debug)]
pub(crate) struct Document(Arc<str>);

impl Document {
    /// Serializes `api` once.
    pub(crate) fn new(api: &OpenApi) -> Self {
        Self(api.to_json().unwrap_or_default().into())
    }
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "meta",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API", body = Object)))]
pub(crate) async fn openapi_json(Extension(doc): Extension<Document>) -> Response {
    let mut resp = doc.0.to_string().into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// Completes the document the routes produced: info, the error answers
/// of every operation and, when `guarded` (an `api_token` is configured),
/// the bearer scheme on `/v1/*`. A token-less instance documents no
/// authentication, and instead its loopback-only `Host` (421) and
/// same-origin writes (403): the document describes the instance serving
/// it. (The book's HTTP API reference is generated from a guarded one.)
pub(crate) fn finish(mut api: OpenApi, guarded: bool) -> OpenApi {
    api.info = InfoBuilder::new()
        .title("mailroom")
        .version(env!("CARGO_PKG_VERSION"))
        .description(Some(
            "Transactional inbox and outbox: webhook and API intake, the stored events, \
             pull workers, and the operator's routes. Errors are RFC 9457 problem+json. \
             `/v1/*` needs `Authorization: Bearer <api_token>` once a token is configured.",
        ))
        .build();
    let components = api.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        BEARER,
        SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
    );
    let problem_schema: RefOr<Schema> = Ref::from_schema_name(ProblemBody::name()).into();
    components
        .schemas
        .insert(ProblemBody::name().into_owned(), ProblemBody::schema());
    for answer in ANSWERS {
        let mut response = ResponseBuilder::new()
            .description(answer.description)
            .content(
                "application/problem+json",
                ContentBuilder::new()
                    .schema(Some(problem_schema.clone()))
                    .build(),
            );
        if answer.retry_after {
            response = response.header(
                "Retry-After",
                HeaderBuilder::new()
                    .schema(Some(
                        ObjectBuilder::new()
                            .schema_type(Type::Integer)
                            .minimum(Some(0)),
                    ))
                    .description(Some("Seconds to wait before retrying"))
                    .build(),
            );
        }
        components
            .responses
            .insert(answer.name.into(), response.build().into());
    }
    for (path, item) in &mut api.paths.paths {
        let v1 = path.starts_with("/v1/");
        let id = path.contains("{id}");
        for (method, op) in [
            ("get", &mut item.get),
            ("put", &mut item.put),
            ("post", &mut item.post),
            ("delete", &mut item.delete),
            ("patch", &mut item.patch),
        ] {
            if let Some(op) = op {
                complete(
                    op,
                    Route {
                        v1,
                        id,
                        write: method != "get",
                        guarded,
                    },
                );
            }
        }
    }
    api
}

/// An error answer in `components.responses`.
struct Answer {
    name: &'static str,
    status: &'static str,
    description: &'static str,
    retry_after: bool,
}

/// The error answers operations refer to, by where they happen.
const ANSWERS: [Answer; 11] = [
    Answer {
        name: PROBLEM,
        status: "default",
        description: "An error, as RFC 9457 problem+json",
        retry_after: false,
    },
    Answer {
        name: UNAUTHORIZED,
        status: "401",
        description: "Missing or wrong bearer token",
        retry_after: false,
    },
    Answer {
        name: "TooManyTokens",
        status: "429",
        description: "Too many wrong bearer tokens from this client; see Retry-After",
        retry_after: true,
    },
    Answer {
        name: "BadRequest",
        status: "400",
        description: "The request is malformed or breaks a rule the detail names",
        retry_after: false,
    },
    Answer {
        name: "NotFound",
        status: "404",
        description: "No such event (an id that is not one names none)",
        retry_after: false,
    },
    Answer {
        name: "PayloadTooLarge",
        status: "413",
        description: "The body exceeds the limit",
        retry_after: false,
    },
    Answer {
        name: "UnsupportedMediaType",
        status: "415",
        description: "The body is not sent as `Content-Type: application/json`",
        retry_after: false,
    },
    Answer {
        name: "UnprocessableContent",
        status: "422",
        description: "The JSON body does not have the fields and types this operation takes",
        retry_after: false,
    },
    Answer {
        name: "Unavailable",
        status: "503",
        description: "Overloaded (more requests in flight than allowed) or the store is unavailable; see Retry-After",
        retry_after: true,
    },
    Answer {
        name: "Misdirected",
        status: "421",
        description: "Without `api_token`, only requests addressed to a loopback name (`Host: localhost`, `127.0.0.1`, `[::1]`) are served",
        retry_after: false,
    },
    Answer {
        name: "CrossOrigin",
        status: "403",
        description: "Without `api_token`, a write that carries a foreign `Origin` is refused",
        retry_after: false,
    },
];

/// What decides an operation's error answers.
struct Route {
    /// Under `/v1/`.
    v1: bool,
    /// Names an event by `{id}`.
    id: bool,
    /// Not a GET.
    write: bool,
    /// An `api_token` is configured.
    guarded: bool,
}

/// Adds the error answers to one operation, and the bearer scheme when the
/// route is behind the token.
fn complete(op: &mut Operation, route: Route) {
    let json_body = op.request_body.as_ref().is_some_and(|b| match b {
        RefOr::T(b) => b.content.contains_key("application/json"),
        RefOr::Ref(_) => false,
    });
    let mut names = vec![PROBLEM, "Unavailable"];
    if json_body {
        names.extend([
            "BadRequest",
            "PayloadTooLarge",
            "UnsupportedMediaType",
            "UnprocessableContent",
        ]);
    }
    if route.id {
        names.push("NotFound");
    }
    if route.guarded {
        if route.v1 {
            names.extend([UNAUTHORIZED, "TooManyTokens"]);
            op.security = Some(vec![SecurityRequirement::new(BEARER, Vec::<String>::new())]);
        }
    } else {
        names.push("Misdirected");
        if route.write {
            names.push("CrossOrigin");
        }
    }
    let answers = &mut op.responses.responses;
    for name in names {
        let Some(answer) = ANSWERS.iter().find(|a| a.name == name) else {
            continue;
        };
        answers
            .entry(answer.status.into())
            .or_insert_with(|| Ref::from_response_name(answer.name).into());
    }
}

/// States in `POST /v1/events`' body what its fields alone cannot:
/// `deliver_at` and `delay` not both; and, with `topics` declared (each
/// `(name, needs_key)`), that `topic` is one of them and that `key` is
/// required with a sequential topic that has neither a `default_key` nor
/// a `key` pointer, as the accept rules say.
pub(crate) fn constrain_create_event(api: &mut OpenApi, topics: &[(String, bool)]) {
    let Some(components) = api.components.as_mut() else {
        return;
    };
    let Some(RefOr::T(Schema::Object(body))) = components.schemas.get_mut(CREATE_EVENT) else {
        return;
    };
    if !topics.is_empty() {
        if let Some(RefOr::T(Schema::Object(topic))) = body.properties.get_mut("topic") {
            topic.enum_values = Some(topics.iter().map(|(n, _)| n.clone().into()).collect());
        }
    }
    let null = |field: &str| {
        ObjectBuilder::new().property(field, ObjectBuilder::new().schema_type(Type::Null))
    };
    let mut whole = AllOfBuilder::new()
        .item(Schema::Object(body.clone()))
        .item(
            AnyOfBuilder::new()
                .item(null("deliver_at"))
                .item(null("delay")),
        )
        .description(body.description.clone());
    let (keyed, free): (Vec<_>, Vec<_>) = topics.iter().partition(|(_, needs_key)| *needs_key);
    if !keyed.is_empty() {
        let topic_in = |list: &[&(String, bool)]| {
            let names: Vec<String> = list.iter().map(|(n, _)| n.clone()).collect();
            ObjectBuilder::new()
                .property(
                    "topic",
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .enum_values(Some(names)),
                )
                .required("topic")
        };
        let mut either = AnyOfBuilder::new();
        if !free.is_empty() {
            either = either.item(topic_in(&free));
        }
        either = either.item(
            topic_in(&keyed)
                .property("key", ObjectBuilder::new().schema_type(Type::String))
                .required("key"),
        );
        whole = whole.item(either);
    }
    components
        .schemas
        .insert(CREATE_EVENT.into(), RefOr::T(Schema::AllOf(whole.build())));
}

/// The name of `POST /v1/events`' body schema.
const CREATE_EVENT: &str = "CreateEvent";
