

@pytest.mark.slow
def test_browser_follows_a_running_job_live(tmp_home):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from spotrun.db import Job, add_event, session
    eng = new_db(tmp_home)
    make_job(eng, "live-job", state=JobState.RUNNING, last_step=10, work={"total_steps": 100})
    make_attempt(eng, "live-job", 1, start=at(0), start_step=0, last_step=10,
                 running_at=at(1))
    server = make_server(load_settings(str(tmp_home)), port=0)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    driver = _browser()
    try:
        driver.get(f"http://127.0.0.1:{server.server_address[1]}/job/live-job")
        WebDriverWait(driver, 60).until(
            lambda d: d.find_element(By.ID, "job-state").text == "running")
        assert "live" in driver.find_element(By.ID, "live").text
        with session(eng) as s:   # the job moves on while the page is open
            job = s.get(Job, "live-job")
            job.state, job.last_step = JobState.SUCCEEDED, 100
            s.add(job)
            add_event(s, "live-job", "succeeded", "after 1 attempt(s)")
            s.commit()
        WebDriverWait(driver, 60).until(
            lambda d: d.find_element(By.ID, "job-state").text == "succeeded")
        assert "final" in driver.find_element(By.ID, "live").text
        assert "100/100" in driver.page_source
    finally:
        driver.quit()
        server.shutdown()
        server.server_close()
