"""What a session writes down and reads back: ``recording`` (the .ttrec file) and its ``codec``,
``evidence`` (the files a finding's capture keeps) and ``export`` (samples as JSON lines and CSV
for scripts). Below the session: they import the base modules, the rules' declarations and the
in-job probe's file names, never a session, a report or the cluster wing.
"""
