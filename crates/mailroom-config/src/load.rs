//! Loading in layers: documented defaults (the serde defaults of [`Config`])
//! → the file → `MAILROOM_*` environment overrides, with `${VAR}` and
//! `${file:PATH}` interpolation in every string value.

use crate::error::ConfigError;
use crate::file::{Config, OneOrMany};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

impl Config {
    /// Loads `path` (or only defaults when `None`), interpolating `${VAR}`
    /// and applying `MAILROOM_*` overrides from `env`.
    pub fn load(
        path: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let (file, text) = match path {
            Some(p) => {
                let file = p.display().to_string();
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    file: file.clone(),
                    source,
                })?;
                (file, text)
            }
            None => ("defaults".to_string(), String::new()),
        };
        let mut config = Self::from_toml(&file, &text, env)?;
        config.from_file = path.is_some();
        Ok(config)
    }

    /// Parses configuration text; `file` names it in errors.
    pub fn from_toml(
        file: &str,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            file: file.to_string(),
            message: e.to_string(),
        })?;
        let mut value = toml::Value::Table(std::mem::take(&mut table));
        interpolate(&mut value, "", env).map_err(|(key, message)| ConfigError::Invalid {
            file: file.to_string(),
            key,
            message,
        })?;
        apply_env_overrides(&mut value, env);
        let mut config: Config = serde_path_to_error::deserialize(value).map_err(|e| {
            let key = e.path().to_string();
            ConfigError::Invalid {
                file: file.to_string(),
                key: if key == "." {
                    "(top level)".into()
                } else {
                    key
                },
                // toml appends "in `path`" itself; the key is already named.
                message: e
                    .into_inner()
                    .to_string()
                    .lines()
                    .filter(|l| !l.starts_with("in `"))
                    .collect::<Vec<_>>()
                    .join(" "),
            }
        })?;
        config.origin = file.to_string();
        config.from_file = true;
        Ok(config)
    }

    /// The listen address, parsed.
    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        self.listen.parse().map_err(|_| ConfigError::Invalid {
            file: self.origin.clone(),
            key: "listen".into(),
            message: format!("{:?} is not an address like 127.0.0.1:8080", self.listen),
        })
    }

    /// Whether `POST /webhooks/{name}` accepts a source the file does not
    /// declare. Only the quick start does: no config file, a loopback
    /// listener. A configured mailroom answers 404 to undeclared sources on
    /// every address, loopback included, since a loopback listener is what
    /// a reverse proxy on the same host exposes. `accept_undeclared_sources
    /// = true` opts in, and is refused with a non-loopback `listen`.
    pub fn accept_undeclared_sources(&self) -> Result<bool, ConfigError> {
        let loopback = self.listen_addr()?.ip().is_loopback();
        match self.accept_undeclared_sources {
            Some(true) if !loopback => Err(self.invalid(
                "accept_undeclared_sources",
                format!(
                    "true with listen = {:?}: anyone who can reach it could post unsigned events; \
                     declare each [[source]] instead, or listen on 127.0.0.1",
                    self.listen
                ),
            )),
            Some(yes) => Ok(yes),
            None => Ok(!self.from_file && loopback),
        }
    }

    /// The listen address, checked against the tokens that guard it: a
    /// listener that is not loopback needs `api_token`, and every token
    /// then at least 32 characters, or 16 mixing three kinds of character
    /// (whoever reaches the port may try to guess it).
    pub fn checked_listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        let addr = self.listen_addr()?;
        if addr.ip().is_loopback() {
            return Ok(addr);
        }
        let tokens = self.api_tokens();
        if tokens.is_empty() {
            return Err(self.invalid(
                "api_token",
                format!(
                    "listen = {addr} is not loopback and no api_token is set: anyone could read and replay events. \
                     Set api_token (or MAILROOM_API_TOKEN), or listen on 127.0.0.1"
                ),
            ));
        }
        for (i, t) in tokens.iter().enumerate() {
            if !strong_token(t) {
                let key = if tokens.len() == 1 {
                    "api_token".to_owned()
                } else {
                    format!("api_token[{i}]")
                };
                return Err(self.invalid(
                    key,
                    format!(
                        "too weak for listen = {addr}, which is not loopback: {STRONG_TOKEN} \
                         (e.g. `openssl rand -hex 32`)"
                    ),
                ));
            }
        }
        Ok(addr)
    }

    /// The API tokens (empty when none is configured).
    pub fn api_tokens(&self) -> Vec<String> {
        self.api_token
            .as_ref()
            .map(OneOrMany::values)
            .unwrap_or_default()
    }

    /// Builds an error about `key` in this configuration.
    pub fn invalid(&self, key: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            file: self.origin.clone(),
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Where the file is: `--config`, else `MAILROOM_CONFIG`, else `./mailroom.toml`
/// if it exists, else none (zero-config defaults).
pub fn locate(flag: Option<PathBuf>, env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    flag.or_else(|| env("MAILROOM_CONFIG").map(PathBuf::from))
        .or_else(|| {
            let p = PathBuf::from("mailroom.toml");
            p.exists().then_some(p)
        })
}

/// Replaces `${VAR}` and `${file:PATH}` in every string; `$$` stands for a
/// literal `$`.
fn interpolate(
    v: &mut toml::Value,
    path: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), (String, String)> {
    match v {
        toml::Value::String(s) if s.contains('$') => {
            *s = expand(s, env).map_err(|m| (path.to_string(), m))?;
        }
        toml::Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                interpolate(item, &format!("{path}[{i}]"), env)?;
            }
        }
        toml::Value::Table(t) => {
            for (k, item) in t.iter_mut() {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                interpolate(item, &p, env)?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn expand(s: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body
                .find('}')
                .ok_or_else(|| "unclosed ${ in value".to_string())?;
            let name = &body[..end];
            if let Some(path) = name.strip_prefix("file:") {
                out.push_str(&read_secret_file(path)?);
                rest = &body[end + 1..];
                continue;
            }
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("invalid variable name {name:?} in ${{...}}"));
            }
            let value = env(name).ok_or_else(|| {
                format!("environment variable {name} is not set (referenced as ${{{name}}})")
            })?;
            out.push_str(&value);
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The contents of a `${file:PATH}` reference (a mounted secret: Docker and
/// Kubernetes secrets, systemd credentials), less one trailing newline.
fn read_secret_file(path: &str) -> Result<String, String> {
    if path.is_empty() {
        return Err("empty path in ${file:...}".into());
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {path} (referenced as ${{file:{path}}}): {e}"))?;
    let text = text.strip_suffix('\n').unwrap_or(&text);
    Ok(text.strip_suffix('\r').unwrap_or(text).to_string())
}

/// `MAILROOM_LISTEN`, `MAILROOM_STORE_URL`, `MAILROOM_API_TOKEN` win over the file.
/// The rule an `api_token` meets when the listener is not loopback.
const STRONG_TOKEN: &str = "an api_token must be at least 32 characters, \
     or at least 16 mixing three of lowercase, uppercase, digits and symbols";

/// Whether `token` meets [`STRONG_TOKEN`].
fn strong_token(token: &str) -> bool {
    let chars = token.chars().count();
    let classes = [
        token.chars().any(|c| c.is_lowercase()),
        token.chars().any(|c| c.is_uppercase()),
        token.chars().any(|c| c.is_ascii_digit()),
        token.chars().any(|c| !c.is_alphanumeric()),
    ]
    .into_iter()
    .filter(|&present| present)
    .count();
    chars >= 32 || (chars >= 16 && classes >= 3)
}

fn apply_env_overrides(v: &mut toml::Value, env: &dyn Fn(&str) -> Option<String>) {
    let Some(root) = v.as_table_mut() else { return };
    if let Some(listen) = env("MAILROOM_LISTEN") {
        root.insert("listen".into(), toml::Value::String(listen));
    }
    if let Some(token) = env("MAILROOM_API_TOKEN") {
        root.insert("api_token".into(), toml::Value::String(token));
    }
    if let Some(url) = env("MAILROOM_STORE_URL") {
        let store = root
            .entry("store")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let Some(t) = store.as_table_mut() {
            t.insert("url".into(), toml::Value::String(url));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    /// An empty file means SQLite next to the binary, listening on loopback, 7-day retention.
    #[test]
    fn zero_config_is_sqlite_on_loopback() {
        let c = Config::from_toml("t", "", &no_env).unwrap();
        assert_eq!(c.listen, "127.0.0.1:8080");
        assert_eq!(c.store.url, "sqlite://mailroom.db");
        assert!(c.store.group_commit);
        assert_eq!(c.retention.done, Duration::from_secs(7 * 86400));
    }

    /// `${file:PATH}` reads a mounted secret wherever `${VAR}` works, one
    /// trailing newline trimmed (and only one); a missing file is an error
    /// naming the key and the path.
    #[test]
    fn secrets_can_come_from_files() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "s3cret-from-a-file\n").unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "p@ss\n\n").unwrap();
        let text = format!(
            "api_token = \"${{file:{}}}\"\n[store]\nurl = \"postgres://u:${{file:{}}}@h/db\"\n",
            token.display(),
            pw.display()
        );
        let c = Config::from_toml("m.toml", &text, &no_env).unwrap();
        assert_eq!(c.api_tokens(), vec!["s3cret-from-a-file".to_string()]);
        assert_eq!(c.store.url, "postgres://u:p@ss\n@h/db");
        let missing = dir.path().join("absent");
        let text = format!("api_token = \"${{file:{}}}\"\n", missing.display());
        let err = Config::from_toml("m.toml", &text, &no_env)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("m.toml: api_token: cannot read"), "{err}");
        assert!(err.contains("absent"), "{err}");
    }

    /// Undeclared sources: the quick start (no file) on loopback accepts them;
    /// any file, even one that only sets `listen` on loopback, does not
    /// unless it opts in; opting in with a public listener is refused.
    #[test]
    fn only_the_quick_start_accepts_undeclared_sources() {
        let quick = Config::load(None, &no_env).unwrap();
        assert!(!quick.from_file);
        assert!(quick.accept_undeclared_sources().unwrap());
        let public = |k: &str| (k == "MAILROOM_LISTEN").then(|| "0.0.0.0:8080".to_string());
        let quick_public = Config::load(None, &public).unwrap();
        assert!(!quick_public.accept_undeclared_sources().unwrap());

        let configured = Config::from_toml("m.toml", "listen = \"127.0.0.1:9000\"\n", &no_env);
        assert!(!configured.unwrap().accept_undeclared_sources().unwrap());
        let opted = Config::from_toml("m.toml", "accept_undeclared_sources = true\n", &no_env);
        assert!(opted.unwrap().accept_undeclared_sources().unwrap());
        let refused = Config::from_toml(
            "m.toml",
            "listen = \"0.0.0.0:8080\"\naccept_undeclared_sources = true\n",
            &no_env,
        )
        .unwrap()
        .accept_undeclared_sources()
        .unwrap_err()
        .to_string();
        assert!(
            refused.starts_with("m.toml: accept_undeclared_sources:"),
            "{refused}"
        );
    }

    /// The annotated example file shipped beside the README parses as it stands.
    #[test]
    fn the_example_file_parses() {
        let env = |k: &str| Some(format!("<{k}>"));
        let text = include_str!("../../../mailroom.example.toml");
        let c = Config::from_toml("mailroom.example.toml", text, &env);
        assert!(c.is_ok(), "{:?}", c.err());
    }

    /// A bad value is reported with the file and the dotted key path; an unknown key is named.
    #[test]
    fn errors_name_the_key() {
        let text = "[[topic]]\nname = \"t\"\nretry = { base = \"2x\" }\n";
        let err = Config::from_toml("m.toml", text, &no_env)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("m.toml: topic[0].retry.base:"), "{err}");
        assert!(err.contains("invalid duration"), "{err}");

        let err = Config::from_toml("m.toml", "lisen = \"x\"", &no_env)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("lisen"), "{err}");
    }

    /// `${VAR}` is replaced from the environment, a missing variable is named, `$$` is a literal `$`.
    #[test]
    fn variables_are_interpolated_and_missing_ones_named() {
        let env = |k: &str| (k == "TOKEN").then(|| "s3cret".to_string());
        let c = Config::from_toml("m", "api_token = \"${TOKEN}\"\n", &env).unwrap();
        assert_eq!(c.api_tokens(), vec!["s3cret".to_string()]);
        let err = Config::from_toml("m", "api_token = \"${NOPE}\"\n", &env)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("api_token") && err.contains("NOPE"), "{err}");
        assert_eq!(expand("a$$b", &env).ok().as_deref(), Some("a$b"));
    }

    /// A listener that is not loopback needs a token, and a strong one;
    /// loopback takes any token or none.
    #[test]
    fn a_public_listener_needs_a_strong_token() {
        let check = |text: &str| {
            Config::from_toml("m.toml", text, &no_env)
                .and_then(|c| c.checked_listen_addr())
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        let err = check("listen = \"0.0.0.0:8080\"\n").unwrap_err();
        assert!(
            err.contains("api_token") && err.contains("not loopback"),
            "{err}"
        );
        let err = check("listen = \"0.0.0.0:8080\"\napi_token = \"a\"\n").unwrap_err();
        assert!(
            err.contains("m.toml: api_token: too weak") && err.contains("32 characters"),
            "{err}"
        );
        let err = check("listen = \"0.0.0.0:8080\"\napi_token = [\"0123456789abcdef0123456789abcdef\", \"password12345678\"]\n")
            .unwrap_err();
        assert!(err.contains("api_token[1]: too weak"), "{err}");
        assert!(
            check("listen = \"0.0.0.0:8080\"\napi_token = \"0123456789abcdef0123456789abcdef\"\n")
                .is_ok()
        );
        assert!(check("listen = \"[::]:8080\"\napi_token = \"Mixed-Case-99-ok\"\n").is_ok());
        assert!(check("listen = \"[::]:8080\"\napi_token = \"mixedcase99nope1\"\n").is_err());
        assert!(check("api_token = \"a\"\n").is_ok());
        assert!(check("").is_ok());
    }

    /// `MAILROOM_LISTEN` and `MAILROOM_STORE_URL` win over the file.
    #[test]
    fn environment_overrides_the_file() {
        let env = |k: &str| match k {
            "MAILROOM_LISTEN" => Some("0.0.0.0:9000".to_string()),
            "MAILROOM_STORE_URL" => Some("sqlite:///tmp/x.db".to_string()),
            _ => None,
        };
        let c = Config::from_toml("m", "listen = \"127.0.0.1:1\"\n", &env).unwrap();
        assert_eq!(c.listen, "0.0.0.0:9000");
        assert_eq!(c.store.url, "sqlite:///tmp/x.db");
    }

    /// `[store] direct_url` (a pooler's database, directly) is read with
    /// `${VAR}`, and absent unless given.
    #[test]
    fn store_direct_url_is_read() {
        let env = |k: &str| (k == "DB_HOST").then(|| "db.internal".to_string());
        let text = "[store]\nurl = \"postgres://bouncer:6432/m\"\n\
                    direct_url = \"postgres://${DB_HOST}:5432/m\"\n";
        let c = Config::from_toml("m", text, &env).unwrap();
        assert_eq!(
            c.store.direct_url.as_deref(),
            Some("postgres://db.internal:5432/m")
        );
        let c = Config::from_toml("m", "", &env).unwrap();
        assert_eq!(c.store.direct_url, None);
    }
}
