//! A pseudo-terminal for tests of what a user's terminal gets (progress bars): the child's stderr
//! on the terminal's far side, everything the terminal shows collected from its near side.

use std::io::Read;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};

/// What a pseudo-terminal has shown so far (bytes, escape sequences included).
#[derive(Clone, Default)]
pub struct Screen(Arc<Mutex<Vec<u8>>>);

impl Screen {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Spawns `cmd` with stderr on a new 120×40 pseudo-terminal.
pub fn spawn_with_stderr_on_terminal(cmd: &mut Command) -> (Child, Screen) {
    let size = nix::pty::Winsize { ws_row: 40, ws_col: 120, ws_xpixel: 0, ws_ypixel: 0 };
    let pty = nix::pty::openpty(Some(&size), None).expect("a pseudo-terminal");
    let child = cmd.stderr(std::process::Stdio::from(pty.slave)).spawn().expect("spawning the command");
    // The command held the terminal's far side; with it dropped, reads end when the child exits.
    cmd.stderr(std::process::Stdio::null());
    let screen = Screen::default();
    let shown = screen.clone();
    let mut master = std::fs::File::from(pty.master);
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        // Linux answers EIO once no process holds the far side: the end of the output.
        while let Ok(n @ 1..) = master.read(&mut chunk) {
            shown.0.lock().unwrap().extend_from_slice(&chunk[..n]);
        }
    });
    (child, screen)
}
