//! `parlor-mcp-test-server`: the testkit's [`TestMcpServer`] on stdin and stdout, the child
//! process the MCP client's stdio tests start.

use parlor_testkit::TestMcpServer;

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    match TestMcpServer::new().serve_stdio().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("parlor-mcp-test-server: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
