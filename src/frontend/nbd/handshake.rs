//! The fixed-newstyle handshake: options until an export is chosen (EXPORT_NAME, INFO, GO, LIST,
//! ABORT, STARTTLS, STRUCTURED_REPLY, LIST/SET_META_CONTEXT).

use super::exec::Exec;
use super::listen::Timed;
use super::{Export, MAX_REQUEST};
use crate::wire::nbd::{self, opt, rep, InfoRequest, MetaContextRequest, OptionHeader};
use std::io::{self, Read, Write};
use std::sync::Arc;

pub(super) fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Option data above this closes the connection (no option of ours needs more).
const MAX_OPTION_LEN: u32 = 64 * 1024;

/// One option reply sent on its own: `kind` (ACK, or an error with `msg` as its text) for `option`.
fn reply(s: &mut Timed, option: u32, kind: u32, msg: &[u8]) -> io::Result<()> {
    s.write_all(&nbd::option_reply(option, kind, msg))
}

/// What the handshake agreed beyond the export: structured replies, and the base:allocation
/// context for NBD_CMD_BLOCK_STATUS.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Negotiated {
    pub(super) structured: bool,
    pub(super) allocation: bool,
}

/// NBD_OPT_STRUCTURED_REPLY, LIST_META_CONTEXT and SET_META_CONTEXT.
fn negotiate(
    s: &mut Timed,
    ex: &Export,
    option: u32,
    data: &[u8],
    neg: &mut Negotiated,
) -> io::Result<()> {
    let refuse = |s: &mut Timed, kind, msg: &str| reply(s, option, kind, msg.as_bytes());
    if option == opt::STRUCTURED_REPLY {
        if !data.is_empty() {
            return refuse(s, rep::ERR_INVALID, "STRUCTURED_REPLY takes no data");
        }
        neg.structured = true;
        return reply(s, option, rep::ACK, &[]);
    }
    let list = option == opt::LIST_META_CONTEXT;
    let req = match MetaContextRequest::parse(data) {
        Ok(r) => r,
        Err(e) => return refuse(s, rep::ERR_INVALID, &e.to_string()),
    };
    if !list && !neg.structured {
        return refuse(
            s,
            rep::ERR_INVALID,
            "SET_META_CONTEXT needs structured replies first",
        );
    }
    if !names_export(ex, &req.name) {
        return refuse(s, rep::ERR_UNKNOWN, &format!("no export '{}'", req.name));
    }
    // LIST without queries lists every context; otherwise each query selects, or not
    let chosen = (list && req.queries.is_empty())
        || req
            .queries
            .iter()
            .any(|q| MetaContextRequest::selects_allocation(q, list));
    if !list {
        neg.allocation = chosen;
    }
    let mut out = Vec::new();
    if chosen {
        let mut d = nbd::BASE_ALLOCATION_ID.to_be_bytes().to_vec();
        d.extend_from_slice(nbd::BASE_ALLOCATION.as_bytes());
        out.extend(nbd::option_reply(option, rep::META_CONTEXT, &d));
    }
    out.extend(nbd::option_reply(option, rep::ACK, &[]));
    s.write_all(&out)
}

/// The handshake on a new connection: the greeting, then options until the client chooses the
/// export (the connection's executor and what was negotiated) or aborts (`None`).
pub(super) fn handshake(
    s: &mut Timed,
    ex: &Export,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> io::Result<Option<(Exec, Negotiated)>> {
    let mut neg = Negotiated::default();
    s.write_all(&nbd::server_greeting())?;
    let mut f = [0u8; 4];
    s.read_exact(&mut f)?;
    let cflags = u32::from_be_bytes(f);
    if cflags & nbd::cflag::FIXED_NEWSTYLE == 0 {
        return Err(bad("client does not speak fixed newstyle"));
    }
    let no_zeroes = cflags & nbd::cflag::NO_ZEROES != 0;
    loop {
        let (option, data) = read_option(s)?;
        let tls_required = tls.is_some() && !s.is_tls();
        match option {
            opt::STARTTLS => start_tls(s, tls.as_ref(), &data)?,
            opt::EXPORT_NAME if tls_required => {
                // no reply exists for EXPORT_NAME but the export itself: close
                return Err(bad("client asked for the export before starting TLS"));
            }
            o if tls_required && o != opt::ABORT => reply(
                s,
                o,
                rep::ERR_TLS_REQD,
                b"this server requires TLS: start it with NBD_OPT_STARTTLS",
            )?,
            opt::EXPORT_NAME => {
                return export_name(s, ex, &data, no_zeroes).map(|e| Some((e, neg)))
            }
            opt::INFO | opt::GO => {
                if let Some(exec) = info_or_go(s, ex, option, &data)? {
                    return Ok(Some((exec, neg)));
                }
            }
            opt::LIST => list(s, ex, &data)?,
            opt::STRUCTURED_REPLY | opt::LIST_META_CONTEXT | opt::SET_META_CONTEXT => {
                negotiate(s, ex, option, &data, &mut neg)?
            }
            opt::ABORT => {
                let _ = reply(s, option, rep::ACK, &[]);
                return Ok(None);
            }
            o => reply(s, o, rep::ERR_UNSUP, &[])?,
        }
    }
}

/// One option's header and data; more data than any option of ours needs closes the connection.
fn read_option(s: &mut Timed) -> io::Result<(u32, Vec<u8>)> {
    let mut h = [0u8; 16];
    s.read_exact(&mut h)?;
    let h = OptionHeader::parse(&h).map_err(|e| bad(e.to_string()))?;
    if h.length > MAX_OPTION_LEN {
        return Err(bad(format!(
            "option {} with {} bytes of data",
            h.option, h.length
        )));
    }
    let mut data = vec![0u8; h.length as usize];
    s.read_exact(&mut data)?;
    Ok((h.option, data))
}

/// Whether `name` chooses our export (the empty name is the default export).
fn names_export(ex: &Export, name: &str) -> bool {
    name.is_empty() || name == ex.name
}

/// NBD_OPT_STARTTLS: acknowledged and TLS started when the export is served with TLS and it is
/// not on yet; refused otherwise (the connection stays as it was).
fn start_tls(
    s: &mut Timed,
    tls: Option<&Arc<rustls::ServerConfig>>,
    data: &[u8],
) -> io::Result<()> {
    let (kind, msg) = match tls {
        Some(cfg) if !s.is_tls() && data.is_empty() => {
            reply(s, opt::STARTTLS, rep::ACK, &[])?;
            return s.start_tls(cfg.clone());
        }
        Some(_) if s.is_tls() => (rep::ERR_INVALID, "TLS is already on"),
        Some(_) => (rep::ERR_INVALID, "STARTTLS takes no data"),
        None => (rep::ERR_UNSUP, "this export is served without TLS"),
    };
    reply(s, opt::STARTTLS, kind, msg.as_bytes())
}

/// NBD_OPT_EXPORT_NAME: the old way to choose the export. It has no error reply, so an unknown
/// name or an export that cannot be opened closes the connection.
fn export_name(s: &mut Timed, ex: &Export, data: &[u8], no_zeroes: bool) -> io::Result<Exec> {
    let name = String::from_utf8_lossy(data);
    if !names_export(ex, &name) {
        return Err(bad(format!("unknown export '{name}'")));
    }
    let exec = Exec::open(ex).map_err(|e| bad(crate::Chain(&e).to_string()))?;
    let mut reply = Vec::with_capacity(134);
    reply.extend_from_slice(&ex.size.to_be_bytes());
    reply.extend_from_slice(&ex.flags().to_be_bytes());
    if !no_zeroes {
        reply.extend_from_slice(&[0u8; 124]);
    }
    s.write_all(&reply)?;
    Ok(exec)
}

/// NBD_OPT_INFO and NBD_OPT_GO: the export's size, flags, block sizes (and name when asked). GO
/// also opens the export and returns its executor; a refusal is an error reply and the client
/// may go on with other options.
fn info_or_go(s: &mut Timed, ex: &Export, option: u32, data: &[u8]) -> io::Result<Option<Exec>> {
    let refuse =
        |s: &mut Timed, kind, msg: &str| reply(s, option, kind, msg.as_bytes()).map(|_| None);
    let req = match InfoRequest::parse(data) {
        Ok(r) => r,
        Err(e) => return refuse(s, rep::ERR_INVALID, &e.to_string()),
    };
    if !names_export(ex, &req.name) {
        let msg = format!(
            "no export '{}'; this server exports '{}'",
            req.name, ex.name
        );
        return refuse(s, rep::ERR_UNKNOWN, &msg);
    }
    let exec = if option == opt::GO {
        match Exec::open(ex) {
            Ok(e) => Some(e),
            Err(e) => {
                let msg = crate::Chain(&e).to_string();
                tracing::info!("NBD: a client's GO refused: {msg}");
                return refuse(s, rep::ERR_POLICY, &msg);
            }
        }
    } else {
        None
    };
    let mut out = nbd::option_reply(option, rep::INFO, &nbd::info_export(ex.size, ex.flags()));
    let pref = 4096u32.max(ex.min_block).min(ex.max_io);
    out.extend(nbd::option_reply(
        option,
        rep::INFO,
        &nbd::info_block_size(ex.min_block, pref, MAX_REQUEST.max(ex.max_io)),
    ));
    if req.requests.contains(&nbd::info::NAME) {
        let mut d = nbd::info::NAME.to_be_bytes().to_vec();
        d.extend_from_slice(ex.name.as_bytes());
        out.extend(nbd::option_reply(option, rep::INFO, &d));
    }
    out.extend(nbd::option_reply(option, rep::ACK, &[]));
    s.write_all(&out)?;
    Ok(exec)
}

/// NBD_OPT_LIST: our one export.
fn list(s: &mut Timed, ex: &Export, data: &[u8]) -> io::Result<()> {
    if !data.is_empty() {
        return reply(s, opt::LIST, rep::ERR_INVALID, b"LIST takes no data");
    }
    let mut d = (ex.name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(ex.name.as_bytes());
    let mut out = nbd::option_reply(opt::LIST, rep::SERVER, &d);
    out.extend(nbd::option_reply(opt::LIST, rep::ACK, &[]));
    s.write_all(&out)
}
