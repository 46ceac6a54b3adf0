//! How a failure reads to a person: one line, each cause once.

/// `error` and its sources as one line, each message once: tonic and hyper wrap one
/// cause in several layers that repeat it ("transport error: transport error: Connection
/// refused (os error 111): Connection refused (os error 111)" says it once).
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next: Option<&dyn std::error::Error> = Some(error);
    while let Some(e) = next {
        let text = e.to_string();
        // A layer that only repeats what a deeper one says adds nothing.
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text) || text.contains(p.as_str())) {
            parts.push(text);
        } else if let Some(last) = parts.last_mut()
            && text.contains(last.as_str())
        {
            *last = text;
        }
        next = e.source();
    }
    // The generic outer words go when a precise cause follows.
    if parts.len() > 1 {
        parts.retain(|p| p != "transport error" && p != "error trying to connect");
    }
    parts.join(": ")
}

/// A server's `main` outcome as its exit status. A failure to start (a flag, a file, a
/// port, the cache directory) is one line on stderr, `PROGRAM: what: why`, each cause
/// once and no backtrace whatever `RUST_BACKTRACE` says: a person reads it and fixes a
/// flag. Exit status 1.
pub fn exit_status(program: &str, outcome: anyhow::Result<()>) -> std::process::ExitCode {
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let error: &(dyn std::error::Error + 'static) = e.as_ref();
            eprintln!("{program}: {}", chain(error));
            std::process::ExitCode::FAILURE
        }
    }
}
