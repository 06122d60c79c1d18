//! Shared helpers for prefixgate's end-to-end tests (servers on 127.0.0.1:0).
