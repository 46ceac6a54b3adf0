//! An address a server can stop and come back on, never free in between: a socket bound
//! to it with `SO_REUSEPORT` and never listening holds the port (no other test can take
//! it), while each listener the server is started on binds the same port beside it. A
//! port freed and bound again could be taken by another test in between (a race); and
//! since the holder does not listen, a connection while the server is down is refused,
//! as it would be by a stopped server.

use std::net::SocketAddr;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;

/// A loopback port kept for one server across its restarts.
#[derive(Debug)]
pub struct KeptAddress {
    _holder: Socket,
    addr: SocketAddr,
}

impl KeptAddress {
    /// A free loopback port, kept from now on.
    #[allow(clippy::new_without_default)] // each call takes a port: not a default value
    pub fn new() -> Self {
        let holder = reusable();
        holder.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into()).unwrap();
        let addr = holder.local_addr().unwrap().as_socket().unwrap();
        Self { _holder: holder, addr }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A listener on this address (one at a time: the previous server stopped first).
    pub fn listener(&self) -> TcpListener {
        // Two listeners would share the connections silently (SO_REUSEPORT): a server
        // still listening here is a test's mistake, named now rather than as a hang.
        let refused = std::net::TcpStream::connect(self.addr)
            .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused);
        assert!(refused, "{} is still served: stop its server before starting another on it", self.addr);
        let socket = reusable();
        socket.bind(&self.addr.into()).unwrap();
        socket.listen(1024).unwrap();
        socket.set_nonblocking(true).unwrap();
        TcpListener::from_std(socket.into()).unwrap()
    }
}

/// A TCP socket that shares its port with the others of this user that set the same
/// (`SO_REUSEPORT`), and binds past connections still in TIME_WAIT (`SO_REUSEADDR`).
fn reusable() -> Socket {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
    socket.set_reuse_address(true).unwrap();
    socket.set_reuse_port(true).unwrap();
    socket
}
