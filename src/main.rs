use clap::Parser;

fn main() {
    let opt = vfsd::cli::Opt::parse();
    if opt.print_capabilities {
        println!(
            "{}",
            serde_json::to_string_pretty(&vfsd::cli::capabilities()).unwrap()
        );
        return;
    }
    if let Err(e) = vfsd::daemon::run(opt) {
        eprintln!("vfsd: {e}");
        std::process::exit(1);
    }
}
