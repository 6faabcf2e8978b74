//! What the client asked of compaction for one request, through the control headers.

use http::header::HeaderMap;

use crate::config::NoticeMode;
use crate::headers;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Compact when a trigger is reached.
    Auto,
    /// `x-compactor: off`: forward as is, whatever the size.
    Off,
    /// `x-compactor: force`: compact even under every trigger.
    Force,
}

impl Control {
    pub fn of(request: &HeaderMap) -> Control {
        match request.get(headers::CONTROL).and_then(|v| v.to_str().ok()) {
            Some(v) if v.eq_ignore_ascii_case("off") => Control::Off,
            Some(v) if v.eq_ignore_ascii_case("force") => Control::Force,
            _ => Control::Auto,
        }
    }
}

/// The notice form for this request: `x-compactor-notice` when valid, else the configured one.
pub fn notice_mode(request: &HeaderMap, configured: NoticeMode) -> NoticeMode {
    request
        .get(headers::NOTICE)
        .and_then(|v| v.to_str().ok())
        .and_then(NoticeMode::parse)
        .unwrap_or(configured)
}
