//! What a route needs of a request's key: the one word the key checks (`middleware`) and the documented errors
//! of each route (`error`) share.

/// What a route needs of a request's key (`server.admin_keys`, `server.search_keys`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Never a key: health, the web page and its assets, the OpenAPI document.
    Open,
    /// A search or admin key when keys are set: everything that only reads.
    Read,
    /// An admin key when keys are set, and an admin key at all on an address beyond loopback: jobs and writes.
    Admin,
}
