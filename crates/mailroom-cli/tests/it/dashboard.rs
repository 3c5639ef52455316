//! The dashboard in a real browser: Debian's `chromium`, driven over
//! WebDriver (`chromedriver`, which `scripts/test.sh` installs) with
//! fantoccini, against the real `mailroom serve` binary. Screenshots of
//! every page go to `<target>/tmp/dashboard-screenshots/`.

use crate::support;
use crate::support::Serve;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const TOKEN: &str = "browser-test-token";
const WAIT: Duration = Duration::from_secs(20);

/// `chromedriver` on a free loopback port; killed on drop.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start(log: &Path) -> Driver {
        let bin = std::env::var("MAILROOM_TEST_CHROMEDRIVER").unwrap_or("chromedriver".into());
        let port = StdListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let log = std::fs::File::create(log).expect("chromedriver log file");
        let child = Command::new(&bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("{bin} did not start ({e}): apt-get install chromium chromium-driver")
            });
        Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Waits until chromedriver says it is ready.
    async fn ready(&self) {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + WAIT;
        loop {
            let status = http.get(format!("{}/status", self.url)).send().await;
            if let Ok(resp) = status {
                let body: Value = resp.json().await.unwrap_or_default();
                if body["value"]["ready"] == true {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver not ready in {WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A headless Chromium session. The flags keep it off the network (this
/// machine has none; without them it waits on it) and in a fresh profile.
async fn browser(driver: &Driver, profile: &Path) -> Client {
    let chromium = std::env::var("MAILROOM_TEST_CHROMIUM").unwrap_or("/usr/bin/chromium".into());
    let args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        &format!("--user-data-dir={}", profile.display()),
    ];
    let caps = json!({
        "browserName": "chrome",
        "goog:chromeOptions": { "binary": chromium, "args": args },
    });
    let Value::Object(caps) = caps else {
        unreachable!("a JSON object")
    };
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a WebDriver session with chromium")
}

/// The HTTP handler's receiver: 500 until `fixed`, then 200.
async fn receiver(fixed: Arc<AtomicBool>) -> String {
    use axum::http::StatusCode;
    let app = axum::Router::new().route(
        "/orders",
        axum::routing::post(move || {
            let fixed = fixed.load(Ordering::SeqCst);
            async move {
                if fixed {
                    (StatusCode::OK, "ok")
                } else {
                    (StatusCode::INTERNAL_SERVER_ERROR, "warehouse is down")
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind receiver");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/orders")
}

fn config(dir: &Path, handler_url: &str) -> PathBuf {
    let path = dir.join("mailroom.toml");
    let text = format!(
        r#"
api_token = "{TOKEN}"

[[source]]
name = "shop"
topic = "orders"
id = {{ json = "/id" }}
type = {{ json = "/type" }}

[[topic]]
name = "orders"
mode = "sequential"
key = "/customer"
retry = {{ max_attempts = 2, base = "100ms", factor = 2.0, max_delay = "1s", jitter = 0.0 }}
handler = {{ http = {{ url = "{handler_url}", timeout = "5s" }} }}
"#
    );
    std::fs::write(&path, text).expect("write config");
    path
}

/// Saves a screenshot of what the browser shows as `<name>.png`.
async fn shoot(c: &Client, dir: &Path, name: &str) {
    let png = c.screenshot().await.expect("screenshot");
    std::fs::write(dir.join(format!("{name}.png")), png).expect("write screenshot");
}

async fn text_of(c: &Client, css: &str) -> String {
    let el = c
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css} on the page: {e}"));
    el.text().await.expect("text")
}

/// The event's status through the API.
async fn api_status(serve: &Serve, id: &str) -> String {
    let v: Value = reqwest::Client::new()
        .get(format!("{}/v1/events/{id}", serve.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("GET event")
        .json()
        .await
        .expect("json");
    v["status"].as_str().unwrap_or_default().to_owned()
}

/// Sends one order whose handler fails, and waits until it is dead.
async fn dead_order(serve: &Serve) -> String {
    let order =
        json!({"id": "order-1", "type": "order.created", "customer": "c-42", "total": 1990});
    let resp: Value = reqwest::Client::new()
        .post(format!("{}/webhooks/shop", serve.base))
        .json(&order)
        .send()
        .await
        .expect("webhook")
        .json()
        .await
        .expect("json");
    let id = resp["id"].as_str().expect("id").to_owned();
    let deadline = Instant::now() + WAIT;
    while api_status(serve, &id).await != "dead" {
        assert!(Instant::now() < deadline, "the order did not die");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    id
}

/// An operator's night: log in, see the dead count on the overview, open
/// the dead event from the dead letters, read its error, fix the handler,
/// press replay (and confirm), and see the event done; every page is
/// photographed, the overview on a phone too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_finds_and_replays_a_dead_event_in_the_browser() {
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots");
    std::fs::create_dir_all(&shots).expect("screenshot dir");
    let dir = tempfile::tempdir().expect("tempdir");
    let fixed = Arc::new(AtomicBool::new(false));
    let cfg = config(dir.path(), &receiver(fixed.clone()).await);
    let store = format!("sqlite://{}", dir.path().join("mailroom.db").display());
    let serve = support::serve(&cfg, &store);
    let id = dead_order(&serve).await;

    let driver = Driver::start(&shots.join("chromedriver.log"));
    driver.ready().await;
    let c = browser(&driver, &dir.path().join("profile")).await;
    let run = operate(&c, &serve, &id, &shots, &fixed).await;
    c.close().await.expect("close the browser");
    run.expect("the operator's steps");
}

async fn operate(
    c: &Client,
    serve: &Serve,
    id: &str,
    shots: &Path,
    fixed: &AtomicBool,
) -> Result<(), fantoccini::error::CmdError> {
    c.goto(&format!("{}/", serve.base)).await?;
    assert!(
        c.current_url().await?.path().ends_with("/ui/login"),
        "sent to the login form"
    );
    shoot(c, shots, "login").await;
    c.find(Locator::Id("token")).await?.send_keys(TOKEN).await?;
    c.find(Locator::Id("login")).await?.click().await?;

    let dead = text_of(c, r#"tr[data-topic="orders"] td[data-status="dead"]"#).await;
    assert_eq!(dead, "1", "the overview counts the dead order");
    assert_eq!(c.title().await?, "Overview · mailroom");
    shoot(c, shots, "overview").await;

    c.find(Locator::LinkText("Dead letters"))
        .await?
        .click()
        .await?;
    assert!(text_of(c, "#matching").await.starts_with("1 dead event"));
    shoot(c, shots, "dead-letters").await;
    c.find(Locator::LinkText(id)).await?.click().await?;
    let error = text_of(c, "#last-error").await;
    assert!(
        error.contains("500"),
        "the error text says what the receiver said: {error}"
    );
    shoot(c, shots, "event-dead").await;
    c.find(Locator::LinkText("orders")).await?.click().await?;
    let blocked = text_of(c, "#blocked").await;
    assert!(
        blocked.contains("c-42") && blocked.contains(id),
        "the blocked key and its head: {blocked}"
    );
    shoot(c, shots, "topic-blocked").await;
    c.find(Locator::LinkText(id)).await?.click().await?;

    fixed.store(true, Ordering::SeqCst);
    c.find(Locator::Id("replay")).await?.click().await?;
    c.accept_alert().await?;
    assert!(text_of(c, "#flash").await.starts_with("Replayed"));
    let deadline = Instant::now() + WAIT;
    while text_of(c, "#status").await != "done" {
        assert!(Instant::now() < deadline, "the replayed event is not done");
        tokio::time::sleep(Duration::from_millis(200)).await;
        c.refresh().await?;
    }
    assert_eq!(api_status(serve, id).await, "done");
    shoot(c, shots, "event-done").await;

    c.find(Locator::LinkText("orders")).await?.click().await?;
    text_of(c, "table.events").await;
    shoot(c, shots, "topic").await;
    c.goto(&format!("{}/", serve.base)).await?;
    let done = text_of(c, r#"tr[data-topic="orders"] td[data-status="done"]"#).await;
    assert_eq!(done, "1", "the overview counts it done");
    c.set_window_size(390, 844).await?;
    shoot(c, shots, "overview-phone").await;
    Ok(())
}
