//! `[telemetry]`: OTLP/HTTP export of mailroom's spans
//! (`intake`, `attempt`, `handler call`, and the HTTP server's requests),
//! off unless `otlp_endpoint` is set. Spans leave in batches from the SDK's
//! own thread; the HTTP requests run on the process's tokio runtime with
//! the reqwest client mailroom already uses. [`mailroom::otel`] ties the
//! spans to each event's W3C trace.

use bytes::Bytes;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracerProvider, Tracer};
use std::time::Duration;

/// Where and as what spans are exported.
#[derive(Debug, Clone)]
pub struct Export {
    /// `<otlp_endpoint>/v1/traces`.
    pub traces_url: reqwest::Url,
    /// `service.name`.
    pub service_name: String,
}

/// The export `serve` would do with the configuration `cli` names, read
/// before logging starts. `None` for other verbs, without `otlp_endpoint`,
/// or when the configuration is unusable (`serve` then reports why).
pub fn planned(cli: &crate::Cli) -> Option<Export> {
    if !matches!(cli.command, crate::Command::Serve { .. }) {
        return None;
    }
    let config = crate::commands::load_config(cli).ok()?;
    let traces_url = mailroom_config::otlp_traces_url(&config).ok()??;
    let service_name = config
        .telemetry
        .service_name
        .unwrap_or_else(|| "mailroom".into());
    Some(Export {
        traces_url,
        service_name,
    })
}

/// The tracer provider exporting to `export` (batched, protobuf), its HTTP
/// requests spawned on `runtime`. Shut it down before the runtime ends, so
/// the last batch leaves.
pub fn provider(
    export: &Export,
    runtime: tokio::runtime::Handle,
) -> Result<(SdkTracerProvider, Tracer), opentelemetry_otlp::ExporterBuildError> {
    let client = OnRuntime {
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default(),
        runtime,
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(export.traces_url.as_str())
        .build()?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder_empty()
                .with_service_name(export.service_name.clone())
                .build(),
        )
        .build();
    let tracer = provider.tracer("mailroom");
    Ok((provider, tracer))
}

/// An [`HttpClient`] that sends with reqwest on the process's runtime (the
/// SDK's batch thread has no reactor of its own; a spawned task's handle
/// can be awaited from any executor).
#[derive(Debug)]
struct OnRuntime {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let sent = self.runtime.spawn(async move {
            let response = client.execute(reqwest::Request::try_from(request)?).await?;
            let mut answer = http::Response::new(Bytes::new());
            *answer.status_mut() = response.status();
            *answer.headers_mut() = response.headers().clone();
            *answer.body_mut() = response.bytes().await?;
            Ok::<_, reqwest::Error>(answer)
        });
        // The exporter judges the status itself.
        Ok(sent.await??)
    }
}
