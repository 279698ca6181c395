//! placeholder
use crate::common::Inputs;
use serde_json::Value;
pub async fn run(_inputs: &Inputs) -> Result<Value, String> {
    Err("todo".into())
}
