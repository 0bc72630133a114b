from gpudoctor.cli import entry

entry()
