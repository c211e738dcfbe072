use clap::Parser;

use vfsd::error::Chain;

fn main() {
    let opt = vfsd::cli::Opt::parse();
    if opt.print_capabilities {
        println!(
            "{}",
            serde_json::to_string_pretty(&vfsd::cli::capabilities()).unwrap()
        );
        return;
    }
    if let Some(fd) = opt.supervisor_state_fd {
        // A supervisor that just ran its own upgrade: it goes on where it was.
        vfsd::daemon::init_logging(&opt);
        let e = vfsd::supervisor::resume(fd);
        eprintln!("vfsd: {}", Chain(&e));
        std::process::exit(1);
    }
    if let Err(e) = vfsd::daemon::run(opt) {
        // One line: what failed, then why.
        eprintln!("vfsd: {}", Chain(&e));
        std::process::exit(1);
    }
}
