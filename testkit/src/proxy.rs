//! A small in-process TCP proxy in front of one node, to inject network faults:
//! added latency, a blackhole (bytes swallowed, nothing answered) and cut connections.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the proxy does to traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward everything at once.
    Pass,
    /// Forward every chunk, in each direction, `Duration` after it arrived.
    Delay(Duration),
    /// Accept and read, but forward nothing until the mode changes (a partition: like TCP
    /// retransmission, the bytes are delivered in order once it heals, never lost mid-stream).
    Blackhole,
    /// Close every connection and refuse new ones (connection resets).
    Cut,
}

/// A proxy on a free loopback port; dropped with the runtime that started it.
pub struct Proxy {
    port: u16,
    mode: Arc<Mutex<Mode>>,
    changes: watch::Sender<Mode>,
}

impl Proxy {
    /// Starts a proxy to `127.0.0.1:upstream_port` on the current Tokio runtime.
    pub async fn start(upstream_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy addr").port();
        let mode = Arc::new(Mutex::new(Mode::Pass));
        let (changes, _) = watch::channel(Mode::Pass);
        let accept_mode = Arc::clone(&mode);
        let accept_changes = changes.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let current = *accept_mode.lock().expect("mode");
                if current == Mode::Cut {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                for (r, w) in [
                    (Box::new(cr) as Reader, Box::new(sw) as Writer),
                    (Box::new(sr), Box::new(cw)),
                ] {
                    tokio::spawn(pump(
                        r,
                        w,
                        Arc::clone(&accept_mode),
                        accept_changes.subscribe(),
                    ));
                }
            }
        });
        Proxy {
            port,
            mode,
            changes,
        }
    }

    /// A proxy in front of the server at `url` (`redis://host:port`, loopback), doing `mode`
    /// from the start.
    pub async fn in_front_of(url: &str, mode: Mode) -> Proxy {
        let port = url
            .rsplit(':')
            .next()
            .and_then(|p| p.trim_end_matches('/').parse().ok())
            .expect("a redis://host:port URL");
        let proxy = Proxy::start(port).await;
        proxy.set(mode);
        proxy
    }

    /// A proxy in front of each server of `urls`, all doing `mode` from the start.
    pub async fn in_front_of_each(urls: &[String], mode: Mode) -> Vec<Proxy> {
        let mut proxies = Vec::with_capacity(urls.len());
        for url in urls {
            proxies.push(Proxy::in_front_of(url, mode).await);
        }
        proxies
    }

    /// The proxy's URL, to give to the builder instead of the node's.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Changes what the proxy does, for open and new connections alike.
    pub fn set(&self, mode: Mode) {
        *self.mode.lock().expect("mode") = mode;
        let _ = self.changes.send(mode);
    }
}

type Reader = Box<dyn tokio::io::AsyncRead + Unpin + Send>;
type Writer = Box<dyn tokio::io::AsyncWrite + Unpin + Send>;

async fn pump(
    mut from: Reader,
    mut to: Writer,
    mode: Arc<Mutex<Mode>>,
    mut changes: watch::Receiver<Mode>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer_mode = Arc::clone(&mode);
    let mut writer_changes = changes.clone();
    let writer = tokio::spawn(async move {
        while let Some((arrived, bytes)) = rx.recv().await {
            let mut current = *writer_mode.lock().expect("mode");
            while current == Mode::Blackhole {
                if writer_changes.changed().await.is_err() {
                    return;
                }
                current = *writer_changes.borrow();
            }
            match current {
                Mode::Blackhole | Mode::Cut => return,
                Mode::Delay(d) => tokio::time::sleep_until(arrived + d).await,
                Mode::Pass => {}
            }
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if *mode.lock().expect("mode") == Mode::Cut {
                        break;
                    }
                    if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            },
            changed = changes.changed() => {
                if changed.is_err() || *changes.borrow() == Mode::Cut {
                    break;
                }
            }
        }
    }
    drop(tx);
    writer.abort();
}
