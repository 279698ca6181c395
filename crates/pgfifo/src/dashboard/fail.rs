//! What a page or an action answers when it cannot do what was asked.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::html;

use super::html::layout;
use crate::Error;

/// A failed request: its status and a message for the operator.
#[derive(Debug)]
pub(crate) struct Fail {
    pub status: StatusCode,
    pub message: String,
}

impl Fail {
    pub(crate) fn bad_request(message: impl Into<String>) -> Fail {
        Fail {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Fail {
        Fail {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
        }
    }

    pub(crate) fn forbidden(message: impl Into<String>) -> Fail {
        Fail {
            status: StatusCode::FORBIDDEN,
            message: message.into(),
        }
    }
}

impl From<Error> for Fail {
    fn from(err: Error) -> Fail {
        let status = match &err {
            Error::InvalidQueue { .. }
            | Error::InvalidGroup { .. }
            | Error::InvalidArgument(_)
            | Error::InvalidOption(_) => StatusCode::BAD_REQUEST,
            Error::JobNotFound(_) | Error::ScheduleNotFound(_) => StatusCode::NOT_FOUND,
            Error::JobRunning(_) | Error::JobState { .. } | Error::GroupBusy { .. } => {
                StatusCode::CONFLICT
            }
            Error::Pool(_) | Error::Connection(_) | Error::ConnectTimeout(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::warn!(error = %err, "pgfifo dashboard: request failed");
        }
        Fail {
            status,
            message: err.to_string(),
        }
    }
}

impl From<bb8::RunError<diesel_async::pooled_connection::PoolError>> for Fail {
    fn from(err: bb8::RunError<diesel_async::pooled_connection::PoolError>) -> Fail {
        Error::Pool(err).into()
    }
}

impl IntoResponse for Fail {
    fn into_response(self) -> Response {
        let title = match self.status {
            StatusCode::BAD_REQUEST => "Bad request",
            StatusCode::NOT_FOUND => "Not found",
            StatusCode::CONFLICT => "Not done",
            StatusCode::FORBIDDEN => "Refused",
            StatusCode::SERVICE_UNAVAILABLE => "Database unavailable",
            _ => "Error",
        };
        let body = layout(
            &super::base::current(),
            title,
            html! {
                h1 { (title) }
                p.error { (self.message) }
                p { a href="javascript:history.back()" { "Back" } }
            },
        );
        (self.status, body).into_response()
    }
}
