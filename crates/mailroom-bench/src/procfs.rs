//! Linux `/proc` readings: resident memory and CPU time of a process and of
//! its threads, so mailroom's footprint is measured apart from the load
//! generator's.

use std::collections::BTreeMap;
use std::time::Duration;

/// Clock ticks per second of `/proc/*/stat` times (USER_HZ; 100 on Linux).
const TICKS_PER_SEC: f64 = 100.0;

/// A `kB` field of `/proc/<pid>/status` (e.g. `VmRSS`, `VmHWM`), in bytes.
pub fn status_bytes(pid: &str, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kb * 1024)
    })
}

/// A field of `/proc/<pid>/io` (e.g. `write_bytes`: bytes sent to the
/// block layer; `wchar`: bytes passed to write calls).
pub fn io_counter(pid: &str, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.trim().parse().ok()
    })
}

/// `(comm, utime + stime)` of one `/proc/.../stat` file.
fn stat_ticks(path: &str) -> Option<(String, u64)> {
    let text = std::fs::read_to_string(path).ok()?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    // After ") ": state is field 3; utime and stime are fields 14 and 15.
    let fields: Vec<&str> = text.get(close + 2..)?.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((comm, utime + stime))
}

/// The `comm` of a process's parent.
pub fn parent_comm(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After ") ": state is field 3, the parent's pid field 4.
    let ppid = text
        .get(text.rfind(')')? + 2..)?
        .split_whitespace()
        .nth(1)?;
    std::fs::read_to_string(format!("/proc/{ppid}/comm"))
        .ok()
        .map(|c| c.trim().to_string())
}

/// CPU time of a whole process so far.
pub fn process_cpu(pid: &str) -> Option<Duration> {
    stat_ticks(&format!("/proc/{pid}/stat"))
        .map(|(_, t)| Duration::from_secs_f64(t as f64 / TICKS_PER_SEC))
}

/// CPU time so far per thread name (threads of one name summed).
pub fn threads_cpu(pid: &str) -> BTreeMap<String, Duration> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for entry in dir.flatten() {
        let path = format!("{}/stat", entry.path().display());
        if let Some((comm, ticks)) = stat_ticks(&path) {
            *out.entry(comm).or_insert(Duration::ZERO) +=
                Duration::from_secs_f64(ticks as f64 / TICKS_PER_SEC);
        }
    }
    out
}

/// CPU used per thread name between two readings, as a share of one core
/// over `window` (1.0 = one core busy all the time).
pub fn cpu_share(
    before: &BTreeMap<String, Duration>,
    after: &BTreeMap<String, Duration>,
    window: Duration,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(name, t)| {
            let used = t.saturating_sub(before.get(name).copied().unwrap_or_default());
            (name.clone(), used.as_secs_f64() / window.as_secs_f64())
        })
        .filter(|(_, share)| *share >= 0.005)
        .collect()
}

/// The process listening on TCP port `port` (IPv4 or IPv6), found through
/// the socket's inode in `/proc/net/tcp*` and the processes' open files
/// (needs root, or the same user, to read other processes' `fd`).
pub fn listener_pid(port: u16) -> Option<String> {
    let inode = ["/proc/net/tcp", "/proc/net/tcp6"].iter().find_map(|f| {
        let text = std::fs::read_to_string(f).ok()?;
        text.lines().skip(1).find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields.get(1)?.rsplit(':').next()?;
            let listening = fields.get(3) == Some(&"0A");
            (listening && u16::from_str_radix(local_port, 16).ok()? == port)
                .then(|| fields.get(9).map(|i| (*i).to_string()))
                .flatten()
        })
    })?;
    let target = format!("socket:[{inode}]");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|proc| {
        let pid = proc.file_name().to_str()?.to_string();
        pid.bytes().all(|b| b.is_ascii_digit()).then_some(())?;
        let fds = std::fs::read_dir(proc.path().join("fd")).ok()?;
        fds.flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == target.as_str()))
            .then_some(pid)
    })
}

/// Peak VmRSS seen by a sampler.
#[derive(Debug, Default, Clone, Copy)]
pub struct RssPeak {
    /// Highest VmRSS sampled, bytes.
    pub sampled_max: u64,
}

/// Samples `pid`'s VmRSS every 100 ms until `stop` is cancelled.
pub async fn sample_rss(pid: String, stop: tokio_util::sync::CancellationToken) -> RssPeak {
    let mut peak = RssPeak::default();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if let Some(rss) = status_bytes(&pid, "VmRSS") {
                    peak.sampled_max = peak.sampled_max.max(rss);
                }
            }
            () = stop.cancelled() => return peak,
        }
    }
}

/// Bytes as MiB (what `ps` and `top` call MB).
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let rss = status_bytes("self", "VmRSS").unwrap();
        assert!(rss > 0);
        assert!(process_cpu("self").is_some());
        let parent = std::fs::read_to_string(format!(
            "/proc/{}/comm",
            std::os::unix::process::parent_id()
        ))
        .unwrap();
        assert_eq!(
            parent_comm(std::process::id()),
            Some(parent.trim().to_string())
        );
        assert!(!threads_cpu("self").is_empty());
    }

    #[test]
    fn finds_the_listener_of_a_port() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(listener_pid(port), Some(std::process::id().to_string()));
    }
}
