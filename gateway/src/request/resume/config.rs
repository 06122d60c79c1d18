//! The `[resume]` settings: whether a stream broken mid-answer is carried on on another
//! replica, how often, and how long a resume may take.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::error::{ConfigFileError, invalid};

/// Carrying a streamed answer on on another replica when its replica fails mid-answer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ResumeConfig {
    /// Resume streams broken after tokens were sent: a continuation (the prompt plus the
    /// text so far) goes to another replica and streams the rest into the same response. A
    /// request's `x-prefixgate-resume: on|off` header overrides this.
    pub enabled: bool,
    /// Most resumes of one request; a stream that breaks once more ends with an error event.
    pub max_resumes: u32,
    /// Longest time from a break to the continuation's response headers (all the attempts
    /// of one resume); then the stream ends with an error event.
    pub deadline_ms: u64,
}

impl Default for ResumeConfig {
    fn default() -> Self {
        ResumeConfig {
            enabled: false,
            max_resumes: 2,
            deadline_ms: 30_000,
        }
    }
}

impl ResumeConfig {
    pub fn validate(&self) -> Result<(), ConfigFileError> {
        if self.deadline_ms == 0 {
            return Err(invalid(
                "resume.deadline_ms",
                "0".to_owned(),
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// The settings as the request path reads them.
    pub fn settings(&self) -> ResumeSettings {
        ResumeSettings {
            enabled: self.enabled,
            max_resumes: self.max_resumes,
            deadline: Duration::from_millis(self.deadline_ms),
        }
    }
}

/// [`ResumeConfig`] for the request path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumeSettings {
    pub enabled: bool,
    pub max_resumes: u32,
    pub deadline: Duration,
}
