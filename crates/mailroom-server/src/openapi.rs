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
use utoipa::openapi::path::Operation;
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

/// Completes the document the routes produced: info, the bearer scheme on
/// `/v1/*` and the problem+json answers.
pub(crate) fn finish(mut api: OpenApi) -> OpenApi {
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
    for (name, description) in [
        (PROBLEM, "An error, as RFC 9457 problem+json"),
        (UNAUTHORIZED, "Missing or wrong bearer token"),
    ] {
        let answer = ResponseBuilder::new().description(description).content(
            "application/problem+json",
            ContentBuilder::new()
                .schema(Some(problem_schema.clone()))
                .build(),
        );
        components
            .responses
            .insert(name.into(), answer.build().into());
    }
    for (path, item) in &mut api.paths.paths {
        let guarded = path.starts_with("/v1/");
        for op in [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ]
        .into_iter()
        .flatten()
        {
            complete(op, guarded);
        }
    }
    api
}

/// Adds the error answers to one operation, and the bearer scheme when the
/// route is behind the token.
fn complete(op: &mut Operation, guarded: bool) {
    let answers = &mut op.responses.responses;
    answers
        .entry("default".into())
        .or_insert_with(|| Ref::from_response_name(PROBLEM).into());
    if guarded {
        answers
            .entry("401".into())
            .or_insert_with(|| Ref::from_response_name(UNAUTHORIZED).into());
        op.security = Some(vec![SecurityRequirement::new(BEARER, Vec::<String>::new())]);
    }
}
