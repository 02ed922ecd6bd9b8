//! `longrank index`, `longrank embed` and `longrank collections delete` against a cluster whose collections a
//! server writes (`store.objects`): the CLI is not a second writer; it sends each input file to the writer as an
//! upload (streamed, as `POST /collections/NAME/documents`), the embedding as `POST /collections/NAME/embeddings`
//! or the deletion as `DELETE /collections/NAME`, and follows each task to its end. The writer applies and publishes it, as for any client.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use longrank::config::Config;
use longrank::corpus::Format;
use longrank::index::OnError;
use serde_json::Value;

/// A client of the writer at `url`, with the configuration's first admin key if any.
pub struct WriterClient {
    url: String,
    key: Option<String>,
    agent: ureq::Agent,
}

impl WriterClient {
    pub fn new(url: String, config: &Config) -> WriterClient {
        WriterClient { url, key: config.server.admin_keys.first().cloned(), agent: ureq::Agent::new() }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    fn request(&self, method: &str, path: &str) -> ureq::Request {
        let request = self.agent.request(method, &format!("{}{path}", self.url));
        match &self.key {
            Some(key) => request.set("authorization", &format!("Bearer {key}")),
            None => request,
        }
    }

    /// Sends `file`'s documents to `collection`; the finished task.
    pub fn upload(&self, collection: &str, file: &Path, format: Format, on_error: OnError) -> anyhow::Result<Value> {
        let mut path = format!("/collections/{collection}/documents?on_error={}", wire_name(on_error));
        if format != Format::Auto {
            path.push_str(&format!("&format={}", wire_name(format)));
        }
        let body = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
        let sent = self.request("POST", &path).set("content-type", "application/octet-stream").send(body);
        self.follow(sent, &format!("sending {}", file.display()))
    }

    /// Embeds `collection`'s segments with the bi-encoder `model` (of those `for_model` reads) and indexes them;
    /// the finished task.
    pub fn embed(&self, collection: &str, model: Option<&str>, for_model: Option<&str>) -> anyhow::Result<Value> {
        let body = serde_json::json!({"model": model, "for": for_model});
        let sent = self.request("POST", &format!("/collections/{collection}/embeddings")).send_json(body);
        self.follow(sent, &format!("embedding {collection}"))
    }

    /// Deletes `collection`; the finished task.
    pub fn delete(&self, collection: &str) -> anyhow::Result<Value> {
        let sent = self.request("DELETE", &format!("/collections/{collection}")).call();
        self.follow(sent, &format!("deleting {collection}"))
    }

    /// The task a write answered with, followed until it ends; refused unless it succeeded.
    fn follow(&self, sent: Result<ureq::Response, ureq::Error>, what: &str) -> anyhow::Result<Value> {
        let mut task: Value = match sent {
            Ok(response) => response.into_json()?,
            Err(ureq::Error::Status(status, response)) => {
                bail!("{what}: the writer ({}) answered {status}: {}", self.url, response.into_string()?)
            }
            Err(e) => bail!("{what}: the writer ({}): {e}", self.url),
        };
        while !matches!(task["status"].as_str(), Some("succeeded" | "failed" | "cancelled")) {
            std::thread::sleep(Duration::from_millis(300));
            task = self.request("GET", &format!("/tasks/{}", task["id"])).call()?.into_json()?;
        }
        if task["status"] != "succeeded" {
            bail!("{what}: task {} {}: {}", task["id"], task["status"], task["error"]);
        }
        Ok(task)
    }
}

/// A value's name on the wire (its serde spelling).
fn wire_name(value: impl serde::Serialize) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}
